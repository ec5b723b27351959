// The static arena plan (no GPU needed): values live at the same time never
// share bytes, released memory is reused, offsets are aligned; kept scratch
// and copies live until their last reader; with the compiler's plan every
// block takes its offset, and a plan that gives too little is refused.
#include "cuda/ArenaPlan.h"

#include "core/Error.h"

#include "gtest/gtest.h"

#include <vector>

using namespace mtrt;
using namespace mtrt::cuda;

namespace {

struct Block {
  size_t offset, bytes;
};

bool overlap(const Block &a, const Block &b) {
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

TEST(OffsetAllocatorTest, ReusesReleasedBlocksAndMergesNeighbours) {
  OffsetAllocator allocator;
  size_t a = allocator.allocate(1000), b = allocator.allocate(300),
         c = allocator.allocate(256);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1024u);
  EXPECT_EQ(c, 1536u);
  allocator.release(a, 1000);
  allocator.release(b, 300);
  // The merged block of 1536 bytes takes a request of 1200.
  EXPECT_EQ(allocator.allocate(1200), 0u);
  EXPECT_EQ(allocator.peak(), 1792u);
  // The best fit, not the first: a hole of 256 bytes at 1280 fits 200.
  EXPECT_EQ(allocator.allocate(200), 1280u);
  EXPECT_EQ(allocator.peak(), 1792u);
}

TEST(OffsetAllocatorTest, ExtendsAFreeBlockAtTheTop) {
  OffsetAllocator allocator;
  size_t a = allocator.allocate(256), b = allocator.allocate(512);
  allocator.release(b, 512);
  EXPECT_EQ(allocator.allocate(1024), 256u); // grows from b's start
  EXPECT_EQ(allocator.peak(), 1280u);
  (void)a;
}

/// A chain x0 -> x1 -> ... where each value is freed by the instruction
/// after the one that defines it, plus scratch on every other instruction.
Function chain(int length, int64_t elements) {
  Function f;
  f.name = "chain";
  f.values.push_back({{elements}, DType::F32, elements});
  f.inputs = {0};
  for (int i = 0; i < length; ++i) {
    f.values.push_back({{elements}, DType::F32, elements});
    Instruction inst;
    inst.op = Op::Gelu;
    inst.operands = {i};
    inst.results = {i + 1};
    if (i > 0)
      inst.free = {i};
    f.instructions.push_back(inst);
  }
  f.outputs = {length};
  return f;
}

TEST(ArenaPlanTest, LiveValuesNeverOverlapAndFreedMemoryIsReused) {
  Function f = chain(12, 1000);
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto scratchBytes = [](size_t position) -> size_t {
    return position % 2 ? 3000 : 0;
  };
  ArenaPlan plan = planArena(f, valueBytes, scratchBytes);
  // Walk the run again: at each instruction, check every live block
  // against every other.
  std::vector<bool> live(f.values.size(), false);
  live[0] = true;
  for (size_t position = 0; position < f.instructions.size(); ++position) {
    const Instruction &inst = f.instructions[position];
    for (int64_t r : inst.results)
      live[r] = true;
    std::vector<Block> blocks;
    for (size_t v = 0; v < live.size(); ++v)
      if (live[v]) {
        ASSERT_NE(plan.valueOffset[v], ArenaPlan::kNone);
        EXPECT_EQ(plan.valueOffset[v] % kArenaAlignment, 0u);
        blocks.push_back({plan.valueOffset[v], valueBytes(v)});
      }
    if (plan.scratchBytes[position])
      blocks.push_back(
          {plan.scratchOffset[position], plan.scratchBytes[position]});
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_LE(blocks[i].offset + blocks[i].bytes, plan.bytes);
      for (size_t j = i + 1; j < blocks.size(); ++j)
        EXPECT_FALSE(overlap(blocks[i], blocks[j]))
            << "instruction " << position << ": blocks " << i << " and " << j;
    }
    for (int64_t v : inst.free)
      live[v] = false;
  }
  // Three values and a scratch at a time, not thirteen values.
  EXPECT_LE(plan.bytes, 4 * 4096u);
}

TEST(ArenaPlanTest, ValuesWithoutMemoryGetNoOffset) {
  Function f = chain(2, 10);
  ArenaPlan plan = planArena(
      f, [](int64_t v) -> size_t { return v == 1 ? 0 : 40; },
      [](size_t) -> size_t { return 0; });
  EXPECT_EQ(plan.valueOffset[1], ArenaPlan::kNone);
  EXPECT_NE(plan.valueOffset[2], ArenaPlan::kNone);
  EXPECT_EQ(plan.scratchOffset[0], ArenaPlan::kNone);
}

// Scratch kept for a later instruction (attention's logsumexp for its
// gradient) stays reserved until that instruction, and no value placed in
// between overlaps it.
TEST(ArenaPlanTest, KeptScratchLivesUntilItsLaterInstruction) {
  Function f = chain(6, 1000);
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto scratchBytes = [](size_t position) -> size_t {
    return position == 1 ? 5000 : 0;
  };
  auto keptUntil = [](size_t position) -> size_t {
    return position == 1 ? 4 : position;
  };
  ArenaPlan plan = planArena(f, valueBytes, scratchBytes, keptUntil);
  Block kept{plan.scratchOffset[1], 5000};
  // Values 2..5 are defined at instructions 1..4, while the scratch is kept.
  for (int64_t v = 2; v <= 5; ++v)
    EXPECT_FALSE(overlap(kept, {plan.valueOffset[v], 4000})) << "value " << v;
  EXPECT_LE(kept.offset + kept.bytes, plan.bytes);
}

// A reshape's result shares its operand's bytes; the memory is released
// only when both are.
TEST(ArenaPlanTest, AliasesShareMemoryUntilTheLastIsFreed) {
  Function f = chain(4, 1000);
  // Value 2 (defined at instruction 1) is a reshape of value 1; value 1 is
  // freed at instruction 1, value 2 at instruction 2.
  f.instructions[1].op = Op::Reshape;
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto noScratch = [](size_t) -> size_t { return 0; };
  auto alias = [](int64_t v) -> int64_t { return v == 2 ? 1 : -1; };
  ArenaPlan plan = planArena(f, valueBytes, noScratch, nullptr, alias);
  EXPECT_EQ(plan.valueOffset[2], plan.valueOffset[1]);
  // Value 3 (defined at instruction 2) must not land on the shared block
  // while value 2 is still live there.
  EXPECT_FALSE(overlap({plan.valueOffset[3], 4000}, {plan.valueOffset[2], 4000}));
}

// Copies of values (bf16 GEMM operands) planned here: each its own block,
// kept until its last reader, apart from the values placed meanwhile.
TEST(ArenaPlanTest, CopiesLiveUntilTheirLastReader) {
  Function f = chain(6, 1000);
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto noScratch = [](size_t) -> size_t { return 0; };
  auto copies = [](size_t position) {
    return position == 1 ? std::vector<SideBufferNeed>{{2000, 4, 1}}
                         : std::vector<SideBufferNeed>{};
  };
  ArenaPlan plan =
      planArena(f, valueBytes, noScratch, nullptr, nullptr, copies);
  ASSERT_FALSE(plan.fromCompiler);
  Block copy{plan.copyOffset[1], 2000};
  ASSERT_NE(copy.offset, ArenaPlan::kNone);
  EXPECT_EQ(plan.copyOffset[2], ArenaPlan::kNone);
  for (int64_t v = 2; v <= 5; ++v)
    EXPECT_FALSE(overlap(copy, {plan.valueOffset[v], 4000})) << "value " << v;
  // Value 6 is defined at instruction 5, after the copy is released: it may
  // take the copy's bytes.
  EXPECT_LE(copy.offset + copy.bytes, plan.bytes);
}

// An instruction whose scratch and two copies (a GEMM's operands) are read
// by it alone: all three are live while it runs, so none shares bytes with
// another, nor with its operand or result.
TEST(ArenaPlanTest, AnInstructionsOwnScratchAndCopiesNeverOverlap) {
  Function f = chain(3, 1000);
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto scratchBytes = [](size_t position) -> size_t {
    return position == 1 ? 3000 : 0;
  };
  auto copies = [](size_t position) {
    return position == 1 ? std::vector<SideBufferNeed>{{2000, 1, 0},
                                                       {2000, 1, 1}}
                         : std::vector<SideBufferNeed>{};
  };
  ArenaPlan plan =
      planArena(f, valueBytes, scratchBytes, nullptr, nullptr, copies);
  std::vector<Block> blocks = {{plan.scratchOffset[1], 3000},
                               {plan.copyOffset[0], 2000},
                               {plan.copyOffset[1], 2000},
                               {plan.valueOffset[1], 4000},
                               {plan.valueOffset[2], 4000}};
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = i + 1; j < blocks.size(); ++j)
      EXPECT_FALSE(overlap(blocks[i], blocks[j])) << i << " and " << j;
}

/// chain(4, 1000) with the compiler's plan: value v at v * 4096, and side
/// buffers after the values: instruction 0's kernel block kept through
/// instruction 2, instruction 3's, and a copy of value 1 made at
/// instruction 1 and kept through 3.
Function chainWithPlan() {
  Function f = chain(4, 1000);
  MemoryPlan memory;
  memory.alignment = 256;
  memory.arenaBytes = 8 * 4096;
  for (int64_t v = 0; v < 5; ++v)
    memory.offsets.push_back(v * 4096);
  memory.hasSideBuffers = true;
  memory.sideBuffers = {{0, 5 * 4096, 1024, 2, -1},
                        {1, 6 * 4096, 2048, 3, 1},
                        {3, 7 * 4096, 1024, 3, -1}};
  f.memoryPlan = memory;
  return f;
}

// With the compiler's plan, values, scratch and copies take its offsets.
TEST(ArenaPlanTest, TheCompilersPlanPlacesScratchAndCopies) {
  Function f = chainWithPlan();
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto scratchBytes = [](size_t position) -> size_t {
    return position == 0 || position == 3 ? 1000 : 0;
  };
  auto keptUntil = [](size_t position) -> size_t {
    return position == 0 ? 2 : position;
  };
  auto copies = [](size_t position) {
    return position == 1 ? std::vector<SideBufferNeed>{{2000, 3, 1}}
                         : std::vector<SideBufferNeed>{};
  };
  ArenaPlan plan =
      planArena(f, valueBytes, scratchBytes, keptUntil, nullptr, copies);
  ASSERT_TRUE(plan.fromCompiler);
  EXPECT_EQ(plan.bytes, 8u * 4096);
  for (int64_t v = 0; v < 5; ++v)
    EXPECT_EQ(plan.valueOffset[v], size_t(v * 4096));
  EXPECT_EQ(plan.scratchOffset[0], 5u * 4096);
  EXPECT_EQ(plan.scratchOffset[1], ArenaPlan::kNone);
  EXPECT_EQ(plan.scratchOffset[3], 7u * 4096);
  EXPECT_EQ(plan.copyOffset[1], 6u * 4096);
  EXPECT_EQ(plan.copyOffset[2], ArenaPlan::kNone);
}

// A backend that needs more than the plan gives refuses it at load time.
TEST(ArenaPlanTest, APlanThatGivesTooLittleIsRefused) {
  Function f = chainWithPlan();
  f.name = "chain";
  auto valueBytes = [&](int64_t v) {
    return static_cast<size_t>(f.values[v].numElements) * 4;
  };
  auto noScratch = [](size_t) -> size_t { return 0; };
  auto longer = [](size_t position) { // kept one instruction longer
    return position == 1 ? std::vector<SideBufferNeed>{{2000, 4, 1}}
                         : std::vector<SideBufferNeed>{};
  };
  try {
    planArena(f, valueBytes, noScratch, nullptr, nullptr, longer);
    FAIL() << "expected the plan to be refused";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find(
                  "chain: instructions[1] (gelu): the cuda backend needs a "
                  "bf16 copy of value 1 of 2000 bytes through "
                  "instructions[4]; the bundle's memory plan gives 2048 "
                  "bytes through instructions[3]"),
              std::string::npos)
        << e.what();
  }
  // Without side buffers in the plan (format version 2) it plans alone.
  f.memoryPlan->hasSideBuffers = false;
  f.memoryPlan->sideBuffers.clear();
  EXPECT_FALSE(
      planArena(f, valueBytes, noScratch, nullptr, nullptr, longer)
          .fromCompiler);
}

} // namespace
