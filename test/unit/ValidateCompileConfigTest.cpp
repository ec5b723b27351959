//===- ValidateCompileConfigTest.cpp - Units for Megatron-LM's checks -----===//

#include "CompileConfigTestUtils.h"

using namespace megatron;
using namespace megatron::testing;

namespace {

//===----------------------------------------------------------------------===//
// Validation: one test per check, each with its full message.
//===----------------------------------------------------------------------===//

TEST(ValidateCompileConfigTest, RequiredKeys) {
  CompileConfig config = parse("model:\n  hidden_size: 64\n", "m.yaml");
  EXPECT_EQ(message(validateCompileConfig(config)),
            "m.yaml: num_layers is not set; add 'num_layers: N' to the model "
            "file or pass --num-layers N");
}

TEST(ValidateCompileConfigTest, HiddenSizeDividesByHeads) {
  EXPECT_EQ(validateSmall({{"num_attention_heads", "5"}}),
            "command line (--num-attention-heads): hidden_size 64 is not "
            "divisible by num_attention_heads 5: every head gets hidden_size "
            "/ num_attention_heads channels; use a hidden_size that is a "
            "multiple of 5 (such as 60 or 65) or a num_attention_heads that "
            "divides it (1, 2, 4, 8, 16, 32 or 64)");
}

TEST(ValidateCompileConfigTest, QueryGroupsDivideHeads) {
  EXPECT_EQ(validateSmall({{"num_query_groups", "3"}}),
            "command line (--num-query-groups): num_attention_heads 4 is not "
            "divisible by num_query_groups 3: every key/value head is shared "
            "by the same number of query heads; use a num_query_groups that "
            "divides 4 (1, 2 or 4)");
}

TEST(ValidateCompileConfigTest, TensorParallelDividesHeadsAndGroups) {
  // The location is the file's line where tensor_model_parallel_size is set.
  CompileConfig config = parse(std::string(kSmall) + "  num_query_groups: 2\n" +
                                   "parallel:\n"
                                   "  tensor_model_parallel_size: 3\n",
                               "models/x.yaml");
  EXPECT_EQ(message(validateCompileConfig(config)),
            "models/x.yaml:9:31: num_attention_heads 4 is not divisible by "
            "tensor_model_parallel_size 3: every tensor-parallel rank "
            "computes whole attention heads; tensor_model_parallel_size "
            "values that fit this model: 1 or 2");
  EXPECT_EQ(validateSmall({{"num_attention_heads", "8"},
                           {"num_query_groups", "2"},
                           {"tensor_model_parallel_size", "4"}}),
            "command line (--tensor-model-parallel-size): num_query_groups 2 "
            "is not divisible by tensor_model_parallel_size 4: every "
            "tensor-parallel rank holds whole key/value heads; "
            "tensor_model_parallel_size values that fit this model: 1 or 2");
  EXPECT_EQ(validateSmall({{"ffn_hidden_size", "90"},
                           {"tensor_model_parallel_size", "4"}}),
            "command line (--tensor-model-parallel-size): ffn_hidden_size 90 "
            "is not divisible by tensor_model_parallel_size 4: the MLP's "
            "column-parallel weight is split by columns across the ranks; use "
            "an ffn_hidden_size that is a multiple of 4, or one of the "
            "tensor_model_parallel_size values that fit this model: 1 or 2");
}

TEST(ValidateCompileConfigTest, SequenceParallel) {
  EXPECT_EQ(validateSmall({{"sequence_parallel", "true"}}),
            "command line (--sequence-parallel): sequence_parallel needs "
            "tensor_model_parallel_size > 1: it splits the sequence across "
            "the tensor-parallel ranks, and there is only 1 (Megatron-LM "
            "silently turns it off here; this compiler does not guess); "
            "remove sequence_parallel or set tensor_model_parallel_size to 2 "
            "or more");
  EXPECT_EQ(validateSmall({{"seq_length", "30"},
                           {"max_position_embeddings", "32"},
                           {"tensor_model_parallel_size", "4"},
                           {"sequence_parallel", ""}}),
            "command line (--tensor-model-parallel-size): seq_length 30 is not "
            "divisible by tensor_model_parallel_size 4: sequence_parallel "
            "splits every sequence across the tensor-parallel ranks; use a "
            "seq_length that is a multiple of 4, or one of the "
            "tensor_model_parallel_size values that fit this model: 2");
  // An odd sequence leaves no tensor-parallel size to offer.
  EXPECT_EQ(validateSmall({{"seq_length", "33"},
                           {"max_position_embeddings", "33"},
                           {"tensor_model_parallel_size", "2"},
                           {"sequence_parallel", ""}}),
            "command line (--tensor-model-parallel-size): seq_length 33 is not "
            "divisible by tensor_model_parallel_size 2: sequence_parallel "
            "splits every sequence across the tensor-parallel ranks; use a "
            "seq_length that is a multiple of 2");
  EXPECT_EQ(validateSmall({{"tensor_model_parallel_size", "4"},
                           {"sequence_parallel", ""}}),
            "<success>");
}

TEST(ValidateCompileConfigTest, TensorParallelCommOverlap) {
  EXPECT_EQ(validateSmall({{"tp_comm_overlap", "true"}}),
            "command line (--tp-comm-overlap): tp_comm_overlap needs "
            "tensor_model_parallel_size > 1: it overlaps the tensor-parallel "
            "all-gathers and reduce-scatters with the GEMMs, and "
            "tensor_model_parallel_size 1 has none; remove tp_comm_overlap or "
            "set tensor_model_parallel_size to 2 or more (with "
            "sequence_parallel)");
  EXPECT_EQ(validateSmall({{"tensor_model_parallel_size", "4"},
                           {"tp_comm_overlap", ""}}),
            "command line (--tp-comm-overlap): tp_comm_overlap needs "
            "sequence_parallel (as in Megatron-LM): it cuts the all-gather "
            "before each column-parallel GEMM and the reduce-scatter after "
            "each row-parallel GEMM, which tensor_model_parallel_size 4 "
            "without sequence_parallel does not have (it all-reduces); add "
            "sequence_parallel or remove tp_comm_overlap");
  EXPECT_EQ(validateSmall({{"tensor_model_parallel_size", "4"},
                           {"sequence_parallel", ""},
                           {"tp_comm_overlap", ""}}),
            "<success>");
}

TEST(ValidateCompileConfigTest, ParameterGather) {
  EXPECT_EQ(validateSmall({{"data_parallel_size", "2"},
                           {"overlap_param_gather", ""}}),
            "command line (--overlap-param-gather): overlap_param_gather "
            "needs use_distributed_optimizer (as in Megatron-LM): it overlaps "
            "the distributed optimizer's all-gather of updated parameters "
            "with the next forward pass, and without "
            "use_distributed_optimizer every rank updates all of its "
            "parameters and gathers none; add use_distributed_optimizer or "
            "remove overlap_param_gather");
  EXPECT_EQ(validateSmall({{"data_parallel_size", "2"},
                           {"use_distributed_optimizer", ""},
                           {"overlap_param_gather", ""}}),
            "command line (--overlap-param-gather): "
            "overlap_param_gather needs overlap_grad_reduce (as in "
            "Megatron-LM): the parameters are gathered per gradient bucket, "
            "and without overlap_grad_reduce the buffer is one reduction "
            "with no buckets; add overlap_grad_reduce or remove "
            "overlap_param_gather");
  EXPECT_EQ(validateSmall({{"data_parallel_size", "2"},
                           {"use_distributed_optimizer", ""},
                           {"overlap_grad_reduce", ""},
                           {"overlap_param_gather", ""}}),
            "<success>");
}

TEST(ValidateCompileConfigTest, PipelineStages) {
  // Without interleaving the cost model splits 4 layers over 3 stages.
  EXPECT_EQ(validateSmall({{"pipeline_model_parallel_size", "3"}}),
            "<success>");
  EXPECT_EQ(validateSmall({{"pipeline_model_parallel_size", "5"}}),
            "command line (--pipeline-model-parallel-size): num_layers 4 is "
            "less than pipeline_model_parallel_size 5: every pipeline stage "
            "needs at least one layer; use a pipeline_model_parallel_size of "
            "at most 4");
  EXPECT_EQ(validateSmall({{"pipeline_model_parallel_size", "3"},
                           {"virtual_pipeline_model_parallel_size", "2"}}),
            "command line (--pipeline-model-parallel-size): "
            "num_layers 4 is not divisible by pipeline_model_parallel_size 3: "
            "with virtual_pipeline_model_parallel_size every pipeline stage "
            "gets the same number of layers; use a "
            "pipeline_model_parallel_size that divides 4 (1, 2 or 4)");
  EXPECT_EQ(validateSmall({{"virtual_pipeline_model_parallel_size", "2"}}),
            "command line (--virtual-pipeline-model-parallel-size): "
            "virtual_pipeline_model_parallel_size 2 needs "
            "pipeline_model_parallel_size > 1: interleaving splits each "
            "pipeline rank's layers into virtual stages; set "
            "pipeline_model_parallel_size to 2 or more, or remove "
            "virtual_pipeline_model_parallel_size");
  // Megatron-LM's current flag for the same setting is blamed by its name.
  EXPECT_TRUE(
      StringRef(
          validateSmall({{"--num-virtual-stages-per-pipeline-rank", "2"}}))
          .starts_with("command line (--num-virtual-stages-per-pipeline-rank): "
                       "virtual_pipeline_model_parallel_size 2 needs "));
  EXPECT_EQ(validateSmall({{"num_layers", "6"},
                           {"pipeline_model_parallel_size", "2"},
                           {"virtual_pipeline_model_parallel_size", "2"}}),
            "command line (--virtual-pipeline-model-parallel-size): "
            "num_layers 6 is not divisible by pipeline_model_parallel_size 2 "
            "times virtual_pipeline_model_parallel_size 2: every virtual "
            "stage gets the same number of layers; use a "
            "virtual_pipeline_model_parallel_size that divides the 3 layers "
            "per pipeline stage (1 or 3)");
  EXPECT_EQ(validateSmall({{"num_layers", "8"},
                           {"pipeline_model_parallel_size", "2"},
                           {"virtual_pipeline_model_parallel_size", "2"}}),
            "<success>");
}

TEST(ValidateCompileConfigTest, UnevenPipelineSplit) {
  CompileConfig config = parse(kSmall);
  ASSERT_FALSE(applyOverride(config, "num_layers", "7"));
  ASSERT_FALSE(applyOverride(config, "pipeline_model_parallel_size", "3"));
  ASSERT_FALSE(applyOverride(config, "decoder_first_pipeline_num_layers", "1"));
  EXPECT_EQ(message(validateCompileConfig(config)), "<success>");
  EXPECT_EQ(config.pipelineStageNumLayers(0), 1);
  EXPECT_EQ(config.pipelineStageNumLayers(1), 3);
  EXPECT_EQ(config.pipelineStageNumLayers(2), 3);

  EXPECT_EQ(validateSmall({{"num_layers", "7"},
                           {"pipeline_model_parallel_size", "3"},
                           {"decoder_first_pipeline_num_layers", "2"}}),
            "command line (--decoder-first-pipeline-num-layers): after "
            "decoder_first_pipeline_num_layers 2, 5 of num_layers 7 remain "
            "for the other 2 pipeline stages, which need the same positive "
            "number of layers each; choose the split so that num_layers minus "
            "the explicit layers is a positive multiple of 2");
  EXPECT_EQ(validateSmall({{"pipeline_model_parallel_size", "2"},
                           {"decoder_first_pipeline_num_layers", "1"},
                           {"decoder_last_pipeline_num_layers", "2"}}),
            "command line (--decoder-first-pipeline-num-layers): "
            "decoder_first_pipeline_num_layers 1 and "
            "decoder_last_pipeline_num_layers 2 must add up to num_layers 4 "
            "with pipeline_model_parallel_size 2");
  EXPECT_EQ(validateSmall({{"decoder_last_pipeline_num_layers", "2"}}),
            "command line (--decoder-last-pipeline-num-layers): "
            "decoder_last_pipeline_num_layers sets the layers of one pipeline "
            "stage, but pipeline_model_parallel_size is 1; remove it or set "
            "pipeline_model_parallel_size to 2 or more");
  EXPECT_EQ(validateSmall({{"pipeline_model_parallel_size", "2"},
                           {"virtual_pipeline_model_parallel_size", "2"},
                           {"decoder_first_pipeline_num_layers", "1"}}),
            "command line (--decoder-first-pipeline-num-layers): "
            "decoder_first_pipeline_num_layers cannot be combined with "
            "virtual_pipeline_model_parallel_size 2: the interleaved schedule "
            "gives every virtual stage the same number of layers; remove one "
            "of them");
}

TEST(ValidateCompileConfigTest, GlobalBatch) {
  EXPECT_EQ(validateSmall({{"micro_batch_size", "8"},
                           {"data_parallel_size", "2"},
                           {"global_batch_size", "100"}}),
            "command line (--global-batch-size): global_batch_size 100 is not "
            "divisible by micro_batch_size 8 times data_parallel_size 2 (= "
            "16): every data-parallel rank runs whole micro-batches; use a "
            "global_batch_size that is a multiple of 16 (such as 96 or 112)");
  EXPECT_EQ(validateSmall({{"micro_batch_size", "8"},
                           {"data_parallel_size", "2"},
                           {"use_distributed_optimizer", "true"}}),
            "<success>");
}

TEST(ValidateCompileConfigTest, ContextParallel) {
  // Causal load balancing: 2 * cp chunks of every sequence.
  EXPECT_EQ(validateSmall({{"context_parallel_size", "3"}}),
            "command line (--context-parallel-size): seq_length 32 is not "
            "divisible by 2 * context_parallel_size 3 = 6: causal load "
            "balancing cuts every sequence into 2 * context_parallel_size "
            "chunks (rank i holds chunks i and 2 * context_parallel_size - 1 "
            "- i); use a seq_length that is a multiple of 6 (such as 30 or "
            "36) or a context_parallel_size whose double divides it");
  // Under sequence parallelism each chunk is split over the tensor ranks.
  EXPECT_EQ(validateSmall({{"seq_length", "24"},
                           {"context_parallel_size", "2"},
                           {"tensor_model_parallel_size", "4"},
                           {"sequence_parallel", "true"}}),
            "command line (--context-parallel-size): seq_length 24 is not "
            "divisible by 2 * context_parallel_size 2 * "
            "tensor_model_parallel_size 4 = 16: causal load balancing cuts "
            "every sequence into 2 * context_parallel_size chunks (rank i "
            "holds chunks i and 2 * context_parallel_size - 1 - i), and "
            "sequence_parallel splits each chunk over the tensor-parallel "
            "ranks; use a seq_length that is a multiple of 16 (such as 16 or "
            "32)");
  EXPECT_EQ(validateSmall({{"cp_comm_type", "all_gather"}}),
            "command line (--cp-comm-type): cp_comm_type chooses how "
            "attention exchanges keys and values over the context-parallel "
            "ranks, and context_parallel_size is 1 (nothing is exchanged); "
            "remove cp_comm_type or set context_parallel_size to 2 or more");
  EXPECT_EQ(validateSmall({{"cp_comm_type", "a2a"}}),
            "override failed: cp_comm_type: a2a (Megatron-LM's all-to-all "
            "exchange) is not implemented; use p2p or all_gather");
  EXPECT_EQ(validateSmall({{"--cp-comm-type", "ring"}}),
            "override failed: --cp-comm-type: expected p2p or all_gather, "
            "got 'ring'");
  EXPECT_EQ(validateSmall({{"context_parallel_size", "0"}}),
            "override failed: context_parallel_size: expected a positive "
            "integer, got '0'");
  EXPECT_EQ(validateSmall({{"context_parallel_size", "4"},
                           {"cp_comm_type", "all_gather"},
                           {"tensor_model_parallel_size", "2"},
                           {"sequence_parallel", "true"},
                           {"data_parallel_size", "2"},
                           {"pipeline_model_parallel_size", "2"}}),
            "<success>");
  CompileConfig config =
      parse(std::string(kSmall) + "parallel:\n"
                                  "  context_parallel_size: 2\n"
                                  "  tensor_model_parallel_size: 2\n"
                                  "  data_parallel_size: 2\n");
  EXPECT_EQ(config.parallel.contextParallelSize, 2);
  EXPECT_EQ(config.parallel.cpCommType, CpCommType::P2P);
  EXPECT_EQ(config.parallel.worldSize(), 8);
}

TEST(ValidateCompileConfigTest, ModelShape) {
  EXPECT_EQ(validateSmall(
                {{"hidden_size", "60"}, {"position_embedding_type", "rope"}}),
            "command line (--position-embedding-type): "
            "position_embedding_type rope rotates pairs of channels, but the "
            "head dimension hidden_size / num_attention_heads = 60 / 4 = 15 "
            "is odd; choose hidden_size and num_attention_heads so that it "
            "is even, or use learned_absolute positions");
  EXPECT_EQ(validateSmall({{"max_position_embeddings", "16"}}),
            "command line (--max-position-embeddings): seq_length 32 exceeds "
            "max_position_embeddings 16: learned absolute position "
            "embeddings have one row per position; raise "
            "max_position_embeddings to at least 32 or lower seq_length");
  EXPECT_EQ(validateSmall({{"max_position_embeddings", "16"},
                           {"position_embedding_type", "rope"}}),
            "<success>");
  EXPECT_EQ(validateSmall({{"swiglu", ""}, {"openai_gelu", "true"}}),
            "command line (--openai-gelu): openai_gelu selects the tanh form "
            "of GeLU, but activation is swiglu, which uses SiLU; remove "
            "openai_gelu or use activation gelu");
}

TEST(ValidateCompileConfigTest, RangesOfConfigsBuiltInCode) {
  CompileConfig config = parse(kSmall);
  config.model.hiddenDropout = 1.0;
  EXPECT_EQ(message(validateCompileConfig(config)),
            "x.yaml: hidden_dropout must be a probability in [0, 1), got 1");
  config.model.hiddenDropout = 0;
  config.model.normEpsilon = 0;
  EXPECT_EQ(message(validateCompileConfig(config)),
            "x.yaml: norm_epsilon must be a positive number, got 0");
  config.model.normEpsilon = 1e-5;
  config.model.initMethodStd = -0.02;
  EXPECT_EQ(message(validateCompileConfig(config)),
            "x.yaml: init_method_std must be a positive number, got -0.02");
  config.model.initMethodStd = 0.02;
  config.parallel.dataParallelSize = -1;
  EXPECT_EQ(message(validateCompileConfig(config)),
            "x.yaml: data_parallel_size must be a positive integer, got -1");
  config.parallel.dataParallelSize = 1;
  config.recompute.method = "random";
  EXPECT_EQ(message(validateCompileConfig(config)),
            "x.yaml: recompute_method must be uniform or block, got 'random'");
}

TEST(ValidateCompileConfigTest, Recompute) {
  EXPECT_EQ(validateSmall({{"recompute_granularity", "full"},
                           {"pipeline_model_parallel_size", "2"},
                           {"recompute_num_layers", "3"}}),
            "command line (--recompute-num-layers): recompute_num_layers 3 "
            "must be between 1 and the 2 layers per pipeline stage "
            "(num_layers 4, pipeline_model_parallel_size 2) under "
            "recompute_granularity full");
  EXPECT_EQ(validateSmall({{"recompute_granularity", "selective"},
                           {"recompute_method", "block"}}),
            "command line (--recompute-method): recompute_method applies to "
            "recompute_granularity full, not selective (selective "
            "recomputation covers every layer's attention core); remove "
            "recompute_method or use recompute_granularity full");
  EXPECT_EQ(validateSmall({{"recompute_granularity", "full"},
                           {"recompute_method", "block"},
                           {"recompute_num_layers", "4"}}),
            "<success>");
}

TEST(ValidateCompileConfigTest, SizesThatOverflow) {
  EXPECT_EQ(validateSmall({{"hidden_size", "4611686018427387904"},
                           {"num_attention_heads", "4"}}),
            "command line (--hidden-size): the default ffn_hidden_size 4 * "
            "hidden_size: 4 * 4611686018427387904 does not fit in a 64-bit "
            "integer; the sizes are too large to compile: reduce "
            "hidden_size");
  EXPECT_EQ(validateSmall({{"seq_length", "4294967296"},
                           {"max_position_embeddings", "4294967296"}}),
            "command line (--seq-length): the attention scores of one "
            "micro-batch: 17179869184 * 4294967296 does not fit in a 64-bit "
            "integer; the sizes are too large to compile: reduce seq_length, "
            "micro_batch_size");
}

} // namespace
