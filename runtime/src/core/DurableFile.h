// Files written so that a crash leaves either the old file or the whole new one.
#ifndef MTRT_SRC_CORE_DURABLEFILE_H
#define MTRT_SRC_CORE_DURABLEFILE_H

#include "core/Error.h"

#include <cstdint>
#include <string>

namespace mtrt {

/// The status code for a failed system call's errno: PERMISSION_DENIED
/// (EACCES, EPERM, EROFS), NOT_FOUND (ENOENT, ENOTDIR), RESOURCE_EXHAUSTED
/// (ENOSPC, EDQUOT, EFBIG), FAILED_PRECONDITION (EISDIR), DATA_LOSS
/// otherwise.
mtrt_status_code_t statusCodeForErrno(int error);

/// fsyncs the directory `dir`, which makes the renames and creations in it
/// durable. File systems that cannot sync directories (EINVAL) are accepted.
/// Throws Error naming `what` (the file or save it was for), the directory
/// and the system's reason.
void syncDirectory(const std::string &dir, const std::string &what);

/// Writes `path` atomically: the bytes go to `<path>.tmp.<pid>`, and
/// commit() fsyncs it, renames it onto `path` and fsyncs the directory.
/// Until commit() returns, `path` is as it was (absent or the previous
/// file); the destructor removes an uncommitted temporary file.
///
/// Errors are Error with statusCodeForErrno's code and a message that starts
/// with `what` ("writing safetensors 'x'") and names the failing step, the
/// file and the system's reason.
///
/// Thread-safety: none. Two writers of one path in one process share the
/// temporary name, so only one may exist at a time.
class DurableFile {
public:
  DurableFile(std::string path, std::string what);
  ~DurableFile();
  DurableFile(const DurableFile &) = delete;
  DurableFile &operator=(const DurableFile &) = delete;

  void write(const void *data, uint64_t size);
  void commit();

  const std::string &path() const { return path_; }
  const std::string &tempPath() const { return temp_; }

private:
  [[noreturn]] void fail(const std::string &step);

  std::string path_, what_, temp_;
  int fd_ = -1;
  bool created_ = false;
};

/// The directory part of `path` ("." for a bare name, "/" for "/x").
std::string parentDirectory(const std::string &path);

} // namespace mtrt

#endif // MTRT_SRC_CORE_DURABLEFILE_H
