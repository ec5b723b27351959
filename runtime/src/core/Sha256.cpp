// SHA-256 through OpenSSL's EVP_Digest (libcrypto).
#include "core/Sha256.h"

#include "core/Bundle.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace mtrt {

Sha256Digest sha256(const void *data, size_t size) {
  Sha256Digest digest{};
  unsigned int length = 0;
  if (EVP_Digest(data, size, digest.data(), &length, EVP_sha256(), nullptr) !=
          1 ||
      length != digest.size())
    throw Error(MTRT_STATUS_INTERNAL, "OpenSSL's EVP_Digest(SHA-256) failed");
  return digest;
}

Sha256Stream::Sha256Stream() : context_(EVP_MD_CTX_new()) {
  if (!context_ ||
      EVP_DigestInit_ex(static_cast<EVP_MD_CTX *>(context_), EVP_sha256(),
                        nullptr) != 1)
    throw Error(MTRT_STATUS_INTERNAL, "OpenSSL's EVP_DigestInit(SHA-256) failed");
}

Sha256Stream::~Sha256Stream() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX *>(context_));
}

void Sha256Stream::update(const void *data, size_t size) {
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX *>(context_), data, size) != 1)
    throw Error(MTRT_STATUS_INTERNAL, "OpenSSL's EVP_DigestUpdate failed");
}

Sha256Digest Sha256Stream::finish() {
  Sha256Digest digest{};
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(static_cast<EVP_MD_CTX *>(context_), digest.data(),
                         &length) != 1 ||
      length != digest.size())
    throw Error(MTRT_STATUS_INTERNAL, "OpenSSL's EVP_DigestFinal failed");
  return digest;
}

Sha256Digest sha256OfFile(const std::string &path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE *)> file(
      std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file)
    throw Error(MTRT_STATUS_NOT_FOUND, "'" + path + "': cannot open it (" +
                                           std::strerror(errno) + ")");
  Sha256Stream stream;
  std::vector<unsigned char> buffer(1 << 20);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0)
    stream.update(buffer.data(), n);
  if (std::ferror(file.get()))
    throw Error(MTRT_STATUS_DATA_LOSS,
                "'" + path + "': reading it failed (" + std::strerror(errno) +
                    ")");
  return stream.finish();
}

std::string toHex(const Sha256Digest &digest) {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest.size());
  for (uint8_t byte : digest) {
    hex.push_back(digits[byte >> 4]);
    hex.push_back(digits[byte & 15]);
  }
  return hex;
}

} // namespace mtrt
