#include "ir/Dump.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

namespace flextile::ir {

namespace {

struct DumpConfig {
  std::set<std::string, std::less<>> stages;
  std::string dir;
  int sequence = 0;
};

std::set<std::string, std::less<>> splitStages(std::string_view list) {
  std::set<std::string, std::less<>> out;
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace(item);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return out;
}

std::mutex& dumpMutex() {
  static std::mutex m;
  return m;
}

// Read from the environment on first use; setDumpConfig replaces it.
DumpConfig& config() {
  static DumpConfig c = [] {
    DumpConfig d;
    if (const char* s = std::getenv("FLEXTILE_DUMP")) d.stages = splitStages(s);
    if (const char* s = std::getenv("FLEXTILE_DUMP_DIR")) d.dir = s;
    return d;
  }();
  return c;
}

std::string fileSafe(std::string_view s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.substr(0, 80);
}

std::string extension(std::string_view stage) {
  if (stage.starts_with("llvm")) return "ll";
  if (stage == "ptx") return "ptx";
  return "ftir";
}

}  // namespace

bool dumpEnabled(std::string_view stage) {
  std::lock_guard lock(dumpMutex());
  const auto& s = config().stages;
  return s.count(stage) || s.count("all");
}

void dump(std::string_view stage, std::string_view title, std::string_view text) {
  if (!dumpEnabled(stage)) return;
  std::lock_guard lock(dumpMutex());
  DumpConfig& c = config();
  if (c.dir.empty()) {
    std::string out = "// ===== " + std::string(stage) + ": " + std::string(title) + " =====\n" + std::string(text);
    if (out.back() != '\n') out += '\n';
    std::fwrite(out.data(), 1, out.size(), stderr);
    std::fflush(stderr);
    return;
  }
  char seq[16];
  std::snprintf(seq, sizeof seq, "%04d", c.sequence++);
  std::filesystem::path dir(c.dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto path = dir / (std::string(seq) + "-" + std::string(stage) + "-" + fileSafe(title) + "." + extension(stage));
  std::ofstream f(path, std::ios::binary);
  f.write(text.data(), std::streamsize(text.size()));
  if (!f) std::fprintf(stderr, "flextile: cannot write dump file %s\n", path.c_str());
}

bool timingEnabled() {
  static const bool on = [] {
    const char* s = std::getenv("FLEXTILE_TIMING");
    return s && *s && std::string_view(s) != "0";
  }();
  return on;
}

void reportTimings(std::string_view title, const std::vector<std::pair<std::string, double>>& steps) {
  if (!timingEnabled()) return;
  std::string out = "flextile: " + std::string(title) + "\n";
  char line[256];
  double total = 0;
  for (const auto& [step, ms] : steps) {
    std::snprintf(line, sizeof line, "  %10.3f ms  %s\n", ms, step.c_str());
    out += line;
    total += ms;
  }
  std::snprintf(line, sizeof line, "  %10.3f ms  total\n", total);
  out += line;
  std::fputs(out.c_str(), stderr);
}

void setDumpConfig(std::string stages, std::string dir) {
  std::lock_guard lock(dumpMutex());
  DumpConfig& c = config();
  c.stages = splitStages(stages);
  c.dir = std::move(dir);
}

}  // namespace flextile::ir
