// SHA-256 digests through OpenSSL's EVP interface, for the bundle's checksum.
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

/// The digest as 64 lowercase hexadecimal digits.
std::string toHex(const Sha256Digest &digest);

} // namespace mtrt

#endif // MTRT_SRC_CORE_SHA256_H
