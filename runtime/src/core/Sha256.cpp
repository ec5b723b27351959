// SHA-256 through OpenSSL's EVP_Digest (libcrypto).
#include "core/Sha256.h"

#include "core/Bundle.h"

#include <openssl/evp.h>

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
