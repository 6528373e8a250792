#include "codegen/Ptxas.h"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "ir/IR.h"

extern char** environ;

namespace flextile::codegen {

namespace fs = std::filesystem;

std::optional<std::string> findPtxas() {
  auto executable = [](const fs::path& p) { return ::access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p); };
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && executable(fs::path(dir) / "ptxas")) return (fs::path(dir) / "ptxas").string();
  }
  if (executable("/usr/local/cuda/bin/ptxas")) return std::string("/usr/local/cuda/bin/ptxas");
  return std::nullopt;
}

OfflineAssembly offlineAssemblyFor(const char* value, bool ptxasFound, bool* unknown) {
  if (unknown) *unknown = false;
  if (!ptxasFound) return OfflineAssembly::Never;
  const std::string v = value ? value : "";
  if (v == "0" || v == "off") return OfflineAssembly::Never;
  if (v == "1" || v == "all") return OfflineAssembly::Always;
  if (!v.empty() && v != "auto" && unknown) *unknown = true;
  return OfflineAssembly::WarpSpecialized;
}

OfflineAssembly offlineAssembly() {
  static const OfflineAssembly policy = [] {
    const char* value = std::getenv("FLEXTILE_PTXAS");
    bool unknown = false;
    OfflineAssembly p = offlineAssemblyFor(value, findPtxas().has_value(), &unknown);
    if (unknown)
      std::fprintf(stderr, "flextile: warning: FLEXTILE_PTXAS='%s' is not 0, off, 1, all or auto; read as auto "
                   "(ptxas assembles the warp-specialized kernels)\n", value);
    return p;
  }();
  return policy;
}

PtxasReport parsePtxasLog(const std::string& log) {
  PtxasReport r;
  r.log = log;
  std::smatch m;
  auto grab = [&](const char* pattern, int& out) {
    if (std::regex_search(log, m, std::regex(pattern))) out = std::stoi(m[1]);
  };
  grab(R"(Used (\d+) registers)", r.registers);
  grab(R"((\d+) bytes spill stores)", r.spillStoreBytes);
  grab(R"((\d+) bytes spill loads)", r.spillLoadBytes);
  grab(R"((\d+) bytes stack frame)", r.stackBytes);
  grab(R"((\d+) bytes smem)", r.staticSharedBytes);
  return r;
}

namespace {

std::string quoteForShell(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

PtxasReport runPtxas(const std::string& ptx, const Target& target) {
  std::optional<std::string> ptxas = findPtxas();
  if (!ptxas)
    throw Error("ptxas: not found on PATH or in /usr/local/cuda/bin; install the CUDA toolkit (ptxas) to assemble "
                "PTX for " + target.smName(),
                ErrorKind::Compile);
  std::string tmpl = (fs::temp_directory_path() / "flextile-ptxas-XXXXXX").string();
  std::vector<char> dirName(tmpl.begin(), tmpl.end());
  dirName.push_back('\0');
  if (!::mkdtemp(dirName.data())) throw Error("ptxas: cannot create a temporary directory from " + tmpl, ErrorKind::Io);
  const fs::path dir(dirName.data());
  const fs::path ptxFile = dir / "kernel.ptx", cubin = dir / "kernel.cubin", logFile = dir / "ptxas.log";
  {
    std::ofstream out(ptxFile);
    out << ptx;
    if (!out) throw Error("ptxas: cannot write " + ptxFile.string(), ErrorKind::Io);
  }
  const std::string arch = "-arch=" + target.smName();
  std::vector<std::string> args{*ptxas, arch, "-v", ptxFile.string(), "-o", cubin.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, logFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int spawnErr = posix_spawn(&pid, ptxas->c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (spawnErr == 0) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  std::string log = readFile(logFile);
  const bool ok = spawnErr == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!ok) {
    // Keep the directory: the PTX in it is the repro.
    std::string why = spawnErr != 0 ? "could not be started (" + std::string(std::strerror(spawnErr)) + ")"
                      : WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                          : "was killed by signal " + std::to_string(WTERMSIG(status));
    throw Error("ptxas " + why + " assembling PTX for " + target.smName() + ":\n" + log +
                "repro: " + quoteForShell(*ptxas) + " " + arch + " -v " + quoteForShell(ptxFile.string()) +
                " -o /dev/null",
                ErrorKind::Compile);
  }
  PtxasReport report = parsePtxasLog(log);
  {
    std::ifstream in(cubin, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    report.cubin = ss.str();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return report;
}

}  // namespace flextile::codegen
