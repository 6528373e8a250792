// Helpers of the fault tests: a temporary folder, a small kernel to compile, and a scope in which
// writes past a few bytes fail as on a full disk.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "dsl/DSL.h"

namespace flextile::testing {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("flextile-faults-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
};

inline std::string readAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void writeAll(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// A kernel whose block size changes its IR.
inline std::unique_ptr<ir::Function> scaleFunction(int block) {
  dsl::Kernel k = dsl::kernel("scale", [](dsl::Ptr<dsl::f32> x, dsl::Ptr<dsl::f32> y, dsl::Int n, dsl::Float a,
                                          dsl::Const<int> BLOCK) {
    auto offs = dsl::program_id(0) * BLOCK + dsl::arange(0, BLOCK);
    auto ok = offs < n;
    dsl::store(y + offs, dsl::load(x + offs, ok) * a, ok);
  });
  auto f = k.trace({.constants = {block}});
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 1, 1};
  return f;
}

// While alive, no file of this process may grow past `bytes` (RLIMIT_FSIZE): a write past it
// fails with EFBIG, as a write to a full disk fails with ENOSPC, without root or a small mount.
// SIGXFSZ, which would end the process, is ignored meanwhile.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    oldHandler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, oldHandler_);
  }
  bool active() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t oldHandler_ = SIG_DFL;
  bool ok_ = false;
};

// Root ignores permission bits, so chmod cannot make a folder read-only for it.
inline bool permissionsBindUs() { return ::geteuid() != 0; }

}  // namespace flextile::testing
