#include "TileProgramProperty.h"

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "TileProgramGenerator.h"
#include "codegen/Compiler.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "ir/Interpreter.h"
#include "ir/Pass.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/SharedLayout.h"
#include "ir/Verifier.h"

namespace flextile::fuzz {
namespace {

using ir::DType;

// The three buffers of a generated program, in parameter order.
constexpr DType kBufferDTypes[] = {DType::F32, DType::F16, DType::I32};
using Memory = std::vector<std::vector<unsigned char>>;

// Random contents: mostly ordinary values, sometimes the edge cases (signed zero, infinities,
// NaN, integer extremes) that passes folding or simplifying must treat like the interpreter.
Memory randomMemory(int64_t elements, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  auto special = [&]() -> float {
    const float values[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 65504.0f, 1.0f};
    return values[rng() % 8];
  };
  Memory mem;
  for (DType dt : kBufferDTypes) {
    std::vector<unsigned char> bytes(size_t(elements) * size_t(ir::byteWidth(dt)));
    for (int64_t i = 0; i < elements; ++i) {
      const bool edge = rng() % 16 == 0;
      if (dt == DType::F32) {
        float v = edge ? special() : normal(rng);
        std::memcpy(bytes.data() + i * 4, &v, 4);
      } else if (dt == DType::F16) {
        Eigen::half h(edge ? special() : normal(rng));
        std::memcpy(bytes.data() + i * 2, &h, 2);
      } else {
        const int32_t extremes[] = {0, -1, INT32_MAX, INT32_MIN, 1};
        int32_t v = edge ? extremes[rng() % 5] : int32_t(rng() % 2001) - 1000;
        std::memcpy(bytes.data() + i * 4, &v, 4);
      }
    }
    mem.push_back(std::move(bytes));
  }
  return mem;
}

// Runs f on a copy of `mem`; throws what the interpreter throws.
Memory run(const ir::Function& f, const GeneratedProgram& g, Memory mem) {
  std::vector<ir::InterpArg> args;
  for (auto& buffer : mem) args.push_back(ir::InterpArg::buffer(buffer.data(), buffer.size()));
  args.push_back(ir::InterpArg::integer(g.n));
  args.push_back(ir::InterpArg::real(g.alpha));
  ir::interpret(f, args, {g.programs, 1, 1}, {.threads = 1});
  return mem;
}

bool isNaN(DType dt, const unsigned char* p) {
  if (dt == DType::F32) {
    float v;
    std::memcpy(&v, p, 4);
    return std::isnan(v);
  }
  if (dt == DType::F16) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return (bits & 0x7c00) == 0x7c00 && (bits & 0x03ff) != 0;
  }
  return false;
}

std::string element(DType dt, const unsigned char* p) {
  if (dt == DType::F32) {
    float v;
    std::memcpy(&v, p, 4);
    return std::to_string(v);
  }
  if (dt == DType::F16) {
    Eigen::half h;
    std::memcpy(&h, p, 2);
    return std::to_string(float(h));
  }
  int32_t v;
  std::memcpy(&v, p, 4);
  return std::to_string(v);
}

// The first element where two runs differ (NaN equals NaN), or "".
std::string difference(const Memory& want, const Memory& got) {
  for (size_t b = 0; b < want.size(); ++b) {
    const DType dt = kBufferDTypes[b];
    const size_t width = size_t(ir::byteWidth(dt));
    for (size_t i = 0; i < want[b].size(); i += width) {
      const unsigned char *w = want[b].data() + i, *g = got[b].data() + i;
      if (std::memcmp(w, g, width) == 0 || (isNaN(dt, w) && isNaN(dt, g))) continue;
      return "buffer " + std::to_string(b) + " (" + std::string(ir::dtypeName(dt)) + ") element " +
             std::to_string(i / width) + " (program " + std::to_string(i / width / kRegion) + "): " +
             element(dt, g) + " instead of " + element(dt, w);
    }
  }
  return "";
}

std::string describe(const std::exception& e) { return e.what(); }

}  // namespace

TileProgramOutcome checkTileProgram(Choices& choices) {
  TileProgramOutcome out;
  GeneratedProgram g = TileProgramGenerator(choices).generate();
  const ir::Function& f = *g.f;
  out.program = ir::printFunction(f);
  f.walk([&](const ir::Op&) { ++out.ops; });
  const std::string where = "\n--- the program (n = " + std::to_string(g.n) + ", alpha = " + std::to_string(g.alpha) +
                            ", grid " + std::to_string(g.programs) + ") ---\n" + out.program;

  auto problems = ir::verificationProblems(f);
  if (!problems.empty()) {
    out.broken = "the generator made IR that does not verify: " + problems[0] + where;
    return out;
  }
  const Memory inputs = randomMemory(g.programs * kRegion, g.dataSeed);
  Memory expected;
  try {
    expected = run(f, g, inputs);
  } catch (const std::exception& e) {
    out.broken = "the generated program fails in the interpreter: " + describe(e) + where;
    return out;
  }
  for (size_t b = 0; b < inputs.size(); ++b)
    for (size_t i = 0; i < inputs[b].size(); ++i) out.changedBytes += inputs[b][i] != expected[b][i];

  const codegen::Target sm80 = codegen::Target::sm80(), sm90 = codegen::Target::sm90a();
  struct Variant {
    std::string name;
    ir::PassPipeline passes;
  };
  std::vector<Variant> variants;
  auto single = [](ir::Pass p) { return ir::PassPipeline().add(std::move(p)); };
  variants.push_back({"canonicalize", single(ir::canonicalizePass())});
  variants.push_back({"cse", single(ir::csePass())});
  variants.push_back({"dce", single(ir::dcePass())});
  variants.push_back({"assign-layouts (sm_80)", single(codegen::assignLayoutsPass(sm80))});
  variants.push_back(
      {"assign-layouts + pipeline (sm_90a)", ir::PassPipeline().add(codegen::assignLayoutsPass(sm90)).add(codegen::pipelinePass(sm90))});
  const codegen::Target target = choices.percent(50) ? sm80 : sm90;
  variants.push_back({"the compiler's tile pipeline (" + target.smName() + ")", codegen::tilePassPipeline(target)});
  if (target != sm90 && g.streamed) variants.push_back({"the compiler's tile pipeline (sm_90a)", codegen::tilePassPipeline(sm90)});

  for (const Variant& v : variants) {
    std::unique_ptr<ir::Function> copy = f.clone();
    try {
      v.passes.run(*copy);
    } catch (const std::exception& e) {
      out.broken = v.name + " fails on a valid program: " + describe(e) + where;
      return out;
    }
    Memory got;
    try {
      got = run(*copy, g, inputs);
    } catch (const std::exception& e) {
      out.broken = "after " + v.name + " the program fails in the interpreter: " + describe(e) + where +
                   "\n--- after " + v.name + " ---\n" + ir::printFunction(*copy);
      return out;
    }
    std::map<const ir::Value*, std::set<const ir::Op*>> loopsFilling;  // ring buffer -> loops refilling it
    copy->walk([&](const ir::Op& op) {
      out.turns = out.turns || op.kind() == ir::OpKind::WarpgroupTurn;
      out.bulkTensor = out.bulkTensor || (op.kind() == ir::OpKind::AtomicAdd && codegen::addsTensorInBulk(op));
      if (op.kind() != ir::OpKind::TmaCopy) return;
      out.tmaRings = true;
      if (const ir::Op* loop = op.parentBlock()->parentOp()) {
        auto& loops = loopsFilling[op.operand(0)];
        loops.insert(loop);
        out.sharedRings = out.sharedRings || loops.size() > 1;
      }
      const ir::SharedLayout& l = *op.operand(0)->type().sharedLayout();
      out.panelRings = out.panelRings || (l.numPanels() > 1 && op.operand(0)->type().dtype() == ir::DType::F16);
    });
    out.producer = out.producer || copy->intAttrOr("producer_warps", 0) > 0;
    if (std::string d = difference(expected, got); !d.empty()) {
      out.broken = v.name + " changes what the program computes: " + d + where + "\n--- after " + v.name + " ---\n" +
                   ir::printFunction(*copy);
      return out;
    }
  }

  out.compiled = g.lowerable;
  if (!g.lowerable) return out;
  // sm_90a too where its passes gave an atomic tile TMA reductions, so that they are lowered.
  std::vector<codegen::Target> targets{target};
  if (out.bulkTensor && target != sm90) targets.push_back(sm90);
  for (const codegen::Target& t : targets) {
    try {
      // ptxas, where there is one, checks that the PTX is valid, not only that it was emitted.
      static const bool havePtxas = codegen::findPtxas().has_value();
      codegen::CompiledKernel k = codegen::compile(f, {.target = t, .runPtxas = havePtxas});
      if (k.ptx.find(".entry random_program") == std::string::npos)
        out.broken = "compile for " + t.smName() + " gave PTX without the kernel's entry" + where;
    } catch (const std::exception& e) {
      out.broken = "compile for " + t.smName() + " fails on a valid program: " + describe(e) + where;
    }
    if (!out.broken.empty()) break;
  }
  return out;
}

}  // namespace flextile::fuzz
