// Atomic, durable file writes: temporary name, fsync, rename, directory fsync.
#include "core/DurableFile.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace mtrt {

mtrt_status_code_t statusCodeForErrno(int error) {
  switch (error) {
  case EACCES:
  case EPERM:
  case EROFS:
    return MTRT_STATUS_PERMISSION_DENIED;
  case ENOENT:
  case ENOTDIR:
    return MTRT_STATUS_NOT_FOUND;
  case ENOSPC:
  case EDQUOT:
  case EFBIG:
    return MTRT_STATUS_RESOURCE_EXHAUSTED;
  case EISDIR:
    return MTRT_STATUS_FAILED_PRECONDITION;
  default:
    return MTRT_STATUS_DATA_LOSS;
  }
}

std::string parentDirectory(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void syncDirectory(const std::string &dir, const std::string &what) {
  auto fail = [&](const std::string &step) {
    int error = errno;
    throw Error(statusCodeForErrno(error), what + ": " + step + " '" + dir +
                                               "': " + std::strerror(error));
  };
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    fail("cannot open the directory to fsync it:");
  int synced = ::fsync(fd);
  int savedErrno = errno;
  ::close(fd);
  errno = savedErrno;
  if (synced != 0 && errno != EINVAL)
    fail("cannot fsync the directory");
}

DurableFile::DurableFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)),
      temp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail("cannot create the temporary file '" + temp_ + "'");
  created_ = true;
}

DurableFile::~DurableFile() {
  if (fd_ >= 0)
    ::close(fd_);
  if (created_)
    ::unlink(temp_.c_str());
}

void DurableFile::write(const void *data, uint64_t size) {
  const char *p = static_cast<const char *>(data);
  while (size > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      fail("cannot write the temporary file '" + temp_ + "'");
    }
    p += n;
    size -= static_cast<uint64_t>(n);
  }
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0)
    fail("cannot fsync the temporary file '" + temp_ + "'");
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    fail("cannot close the temporary file '" + temp_ + "'");
  if (::rename(temp_.c_str(), path_.c_str()) != 0)
    fail("cannot rename the temporary file '" + temp_ + "' onto it");
  created_ = false;
  // The rename is durable only once the directory is synced.
  syncDirectory(parentDirectory(path_), what_);
}

void DurableFile::fail(const std::string &step) {
  int error = errno;
  throw Error(statusCodeForErrno(error),
              what_ + ": " + step + ": " + std::strerror(error));
}

} // namespace mtrt
