// An exclusive lock on a run folder, held by the process that writes it (rank 0): a second
// `train` on the same --output (a relaunched Slurm job while the old one still runs) fails at
// once with the holder's host and PID instead of racing it.
#pragma once

#include <string>

namespace ska::train {

class RunFolderLock {
 public:
  // Takes an advisory lock (flock) on <run_dir>/.lock, creating both, and writes the holder
  // ("host <name> pid <pid>") into it. IOError naming the folder and the holder when another
  // process holds it. The kernel drops the lock when its holder dies, so a lock left by a
  // killed run never blocks its resume.
  explicit RunFolderLock(const std::string& run_dir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace ska::train
