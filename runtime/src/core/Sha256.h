// SHA-256 digests through OpenSSL's EVP interface, for bundles and checkpoints.
#ifndef MTRT_SRC_CORE_SHA256_H
#define MTRT_SRC_CORE_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mtrt {

using Sha256Digest = std::array<uint8_t, 32>;

/// The SHA-256 of `size` bytes at `data`. Throws Error (INTERNAL) if OpenSSL
/// fails, which only happens when it cannot allocate.
Sha256Digest sha256(const void *data, size_t size);

/// A SHA-256 computed over bytes given piece by piece, for files written or
/// read in parts. Thread-safety: none.
class Sha256Stream {
public:
  /// Throws Error (INTERNAL) if OpenSSL cannot allocate its context.
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream &) = delete;
  Sha256Stream &operator=(const Sha256Stream &) = delete;

  void update(const void *data, size_t size);
  /// The digest of everything given; the stream is then spent.
  Sha256Digest finish();

private:
  void *context_; // EVP_MD_CTX
};

/// The SHA-256 of the file at `path`, read in pieces. Throws Error:
/// NOT_FOUND when it cannot be opened, DATA_LOSS when reading fails.
Sha256Digest sha256OfFile(const std::string &path);

/// The digest as 64 lowercase hexadecimal digits.
std::string toHex(const Sha256Digest &digest);

} // namespace mtrt

#endif // MTRT_SRC_CORE_SHA256_H
