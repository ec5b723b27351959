// The reader agrees with the manifest's schema
// (docs/bundle-manifest.schema.json, which the compiler's manifests are
// validated against in test/Target/Bundle/manifest-schema.test): from valid
// manifests, every required key removed, every key given a value of
// another type, every enum given a value outside it and an unknown key added
// to every object is refused with an error naming the key's path; and the
// reader's op table has the schema's ops and attribute types.
//
// The manifests under data/manifests are megatron-compile's (format version
// 12), the JSON between a bundle's header and payload:
//   llama-fused-bf16-tp-sp-dp.json: models/tiny-llama.yaml --num-layers 1
//     --bf16 --fuse-kernels --tensor-model-parallel-size 2
//     --sequence-parallel --data-parallel-size 2 --use-distributed-optimizer
//     --global-batch-size 16 --overlap-grad-reduce --ddp-bucket-size 20000
//     --overlap-param-gather (per-bucket shards with gather_before)
//   gpt-pp-tied-dp.json: models/tiny-gpt.yaml
//     --pipeline-model-parallel-size 2 --data-parallel-size 2
//     --use-distributed-optimizer --global-batch-size 32
//     --overlap-grad-reduce --ddp-bucket-size 20000 --overlap-param-gather
//     (gradient buckets, with and without ready_after)
//   gpt-fused-tp.json: models/tiny-gpt.yaml --num-layers 1 --fuse-kernels
//     --tensor-model-parallel-size 2 (a fused dropout: a body op's attrs)
//   gpt-fp8-tp.json: models/tiny-gpt.yaml --bf16 --num-layers 1
//     --fp8-format hybrid --fp8-amax-history-len 4
//     --fp8-amax-compute-algo max --tensor-model-parallel-size 2 (the fp8
//     section and its metas)
//   moe-pp-ep.json: models/tiny-moe.yaml --pipeline-model-parallel-size 2
//     --data-parallel-size 2 --expert-model-parallel-size 2 --seq-length 32
//     --micro-batch-size 1 --global-batch-size 4 (a stage's aux_loss and
//     predict, the MoE ops and all_to_all)
//   moe-ep.json: models/tiny-moe.yaml --num-layers 1 --data-parallel-size 2
//     --expert-model-parallel-size 2 --seq-length 32 --micro-batch-size 1
//     --global-batch-size 4 --moe-router-score-function sigmoid
//     --moe-router-enable-expert-bias (train_step's output_names, an expert
//     bias)
// Together they hold every key of the schema but the attributes that these
// models' ops lack (their types are checked against the op table instead).
#include "BundleTestBuilder.h"
#include "core/BundleReader.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

Json readJson(const std::string &path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

const Json &schema() {
  static const Json root = readJson(MTRT_TEST_MANIFEST_SCHEMA);
  return root;
}

/// The definition a property's schema refers to, or the schema itself.
const Json &resolve(const Json &node) {
  auto ref = node.find("$ref");
  if (ref == node.end())
    return node;
  std::string name =
      ref->get<std::string>().substr(std::string("#/$defs/").size());
  return schema()["$defs"][name];
}

/// The reader's name for `key` of the object at `path` ("" is the root).
std::string member(const std::string &path, const std::string &key) {
  return path.empty() ? key : path + "." + key;
}

/// A value of a JSON type that `node` (resolved) does not allow.
Json wrongType(const Json &node) {
  std::string type = node.value("type", "");
  if (type == "string" || node.contains("enum") || node.contains("const"))
    return Json(12345);
  return Json("a string");
}

/// A manifest and the payload its `kernels` section points into.
struct Base {
  std::string name;
  Json manifest;
  std::string payload;
};

Base loadBase(const std::string &file) {
  Base base{file,
            readJson(std::string(MTRT_TEST_DATA_DIR) + "/manifests/" + file),
            ""};
  if (base.manifest.contains("kernels")) {
    size_t end = 0;
    for (const char *blob : {"cubin", "ptx", "source"}) {
      const Json &range = base.manifest["kernels"][blob];
      end = std::max(end, range["offset"].get<size_t>() +
                              range["size"].get<size_t>());
    }
    base.payload.assign(end, '\0');
  }
  return base;
}

/// Walks a manifest beside the schema and mutates each key once per kind
/// (the first object of each definition that holds it), expecting the
/// reader to refuse every mutation and name the key.
class SchemaWalker {
public:
  explicit SchemaWalker(const Base &base) : base_(base) {}

  void run() { walk(base_.manifest, schema(), Json::json_pointer(), ""); }

  /// Every "definition.key" mutated so far, over all walkers.
  static std::set<std::string> &covered() {
    static std::set<std::string> keys;
    return keys;
  }

private:
  void expectRefused(const Json &manifest, const std::string &what,
                     const std::string &path) {
    ++checks_;
    try {
      Bundle::parseManifest("schema.mtb", manifest.dump(), base_.payload);
      ADD_FAILURE() << base_.name << ": the reader accepted " << what << " at "
                    << path;
    } catch (const Error &error) {
      std::string message = error.what();
      EXPECT_NE(message.find(path), std::string::npos)
          << base_.name << ": " << what << " at " << path
          << " was refused by a message that does not name it: " << message;
    }
  }

  void walk(const Json &value, const Json &node, const Json::json_pointer &at,
            const std::string &path) {
    const Json &def = resolve(node);
    if (value.is_array() && def.contains("items")) {
      const Json &items = def["items"];
      if (!value.empty() && !resolve(items).contains("properties") &&
          !resolve(items).contains("items")) {
        // An array of scalars: its first item of a wrong type.
        Json manifest = base_.manifest;
        manifest[at / 0] = wrongType(resolve(items));
        expectRefused(manifest, "an item of another type", path + "[0]");
      }
      // Arrays of arrays: the first inner array's items; arrays of
      // objects: each object that holds a key no earlier one did.
      bool nested = !resolve(items).contains("properties");
      for (size_t i = 0; i < value.size(); ++i)
        if ((nested && i == 0) || wouldCover(value[i], items))
          walk(value[i], items, at / i, path + "[" + std::to_string(i) + "]");
      return;
    }
    if (!value.is_object() || !def.contains("properties"))
      return;
    std::string defName = definitionName(node);
    const Json &properties = def["properties"];
    std::set<std::string> required;
    for (const Json &key : def.value("required", Json::array()))
      required.insert(key.get<std::string>());

    Json unknown = base_.manifest;
    unknown[at]["x_unknown_key"] = true;
    expectRefused(unknown, "an unknown key", member(path, "x_unknown_key"));

    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string &key = it.key();
      ASSERT_TRUE(properties.contains(key))
          << base_.name << ": " << member(path, key)
          << " is not in the schema (manifest-schema.test should fail too)";
      std::string keyPath = member(path, key);
      if (!covered().insert(defName + "." + key).second) {
        if (wouldCover(*it, properties[key]))
          walk(*it, properties[key], at / key, keyPath);
        continue;
      }
      const Json &property = resolve(properties[key]);
      if (required.count(key)) {
        Json manifest = base_.manifest;
        manifest[at].erase(key);
        expectRefused(manifest, "a manifest without this required key",
                      keyPath);
      }
      Json retyped = base_.manifest;
      retyped[at / key] = wrongType(property);
      expectRefused(retyped, "a value of another type", keyPath);
      if (property.contains("enum") || property.contains("const")) {
        Json manifest = base_.manifest;
        manifest[at / key] = "x_not_in_the_enum";
        expectRefused(manifest, "a value outside its enum", keyPath);
      }
      walk(*it, properties[key], at / key, keyPath);
    }
  }

  /// Whether walking `value` would mutate a key no earlier object did.
  bool wouldCover(const Json &value, const Json &node) {
    const Json &def = resolve(node);
    if (value.is_array()) {
      if (!def.contains("items"))
        return false;
      for (const Json &item : value)
        if (wouldCover(item, def["items"]))
          return true;
      return false;
    }
    if (!value.is_object())
      return false;
    std::string defName = definitionName(node);
    for (auto it = value.begin(); it != value.end(); ++it)
      if (!covered().count(defName + "." + it.key()) ||
          (def.contains("properties") && def["properties"].contains(it.key()) &&
           wouldCover(*it, def["properties"][it.key()])))
        return true;
    return false;
  }

  static std::string definitionName(const Json &node) {
    auto ref = node.find("$ref");
    return ref == node.end() ? "manifest" : ref->get<std::string>().substr(8);
  }

  const Base &base_;
  int64_t checks_ = 0;
};

const char *kBases[] = {"llama-fused-bf16-tp-sp-dp.json", "gpt-pp-tied-dp.json",
                        "gpt-fused-tp.json", "gpt-fp8-tp.json",
                        "moe-pp-ep.json", "moe-ep.json"};

TEST(BundleManifestSchemaTest, TheCompilersManifestsAreRead) {
  for (const char *file : kBases) {
    Base base = loadBase(file);
    Bundle bundle =
        Bundle::parseManifest(file, base.manifest.dump(), base.payload);
    EXPECT_EQ(base.manifest["version"], Bundle::kFormatVersion) << file;
  }
}

TEST(BundleManifestSchemaTest, TheReaderRefusesWhatTheSchemaRefuses) {
  SchemaWalker::covered().clear();
  for (const char *file : kBases) {
    Base base = loadBase(file);
    SchemaWalker(base).run();
  }
  // The manifests exercised every key of the schema but the attributes
  // (whose types the next test checks against the op table).
  std::vector<std::string> missed;
  for (auto def = schema()["$defs"].begin(); def != schema()["$defs"].end();
       ++def)
    if (def.key() != "attrs" && def->contains("properties"))
      for (auto key = (*def)["properties"].begin();
           key != (*def)["properties"].end(); ++key)
        if (!SchemaWalker::covered().count(def.key() + "." + key.key()))
          missed.push_back(def.key() + "." + key.key());
  for (auto key = schema()["properties"].begin();
       key != schema()["properties"].end(); ++key)
    if (!SchemaWalker::covered().count("manifest." + key.key()))
      missed.push_back("manifest." + key.key());
  EXPECT_TRUE(missed.empty())
      << "keys of the schema that no test manifest holds (add a manifest "
         "that does): "
      << Json(missed).dump();
}

/// The reader's message for `manifest`, or "" if it accepts it.
std::string refusal(const Json &manifest) {
  try {
    Bundle::parseManifest("moe-ep.mtb", manifest.dump());
    return "";
  } catch (const Error &error) {
    return error.what();
  }
}

TEST(BundleManifestSchemaTest, TrainStepsOutputNamesAreChecked) {
  Base base = loadBase("moe-ep.json");
  Json &functions = base.manifest["functions"];
  size_t step = 0;
  while (functions[step]["name"] != "train_step")
    ++step;
  Bundle bundle = Bundle::parseManifest("moe-ep.mtb", base.manifest.dump());
  EXPECT_EQ(bundle.findFunction("train_step")->outputNames,
            (std::vector<std::string>{"loss", "aux_loss",
                                      "load_balancing_loss", "z_loss"}));
  std::string at =
      "functions[" + std::to_string(step) + "].output_names";
  auto refused = [&](const std::function<void(Json &)> &edit,
                     const std::string &expected) {
    Json manifest = base.manifest;
    edit(manifest["functions"][step]);
    std::string message = refusal(manifest);
    EXPECT_NE(message.find(at), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  };
  refused([](Json &f) { f["output_names"][0] = "aux_loss"; },
          "'loss' (the first output)");
  refused([](Json &f) { f["output_names"][1] = "lm_loss"; },
          "one of aux_loss, load_balancing_loss, seq_load_balancing_loss, "
          "z_loss");
  refused([](Json &f) { f["output_names"][2] = "z_loss"; }, "distinct names");
  refused([](Json &f) { f["output_names"][1] = "z_loss";
                        f["output_names"][3] = "aux_loss"; },
          "'aux_loss' second (the auxiliary losses that the loss includes)");
  refused([](Json &f) { f["output_names"].erase(3); },
          "one per output (4)");
  refused([](Json &f) { f["outputs"][1] = f["inputs"][0]; },
          "an f32 scalar");
  Json old = base.manifest;
  old["version"] = 11;
  std::string message = refusal(old);
  EXPECT_NE(message.find("none before format version 12"), std::string::npos)
      << message;
}

TEST(BundleManifestSchemaTest, StagesReportedLossesAreChecked) {
  Base base = loadBase("moe-pp-ep.json");
  Bundle bundle = Bundle::parseManifest("moe-pp-ep.mtb", base.manifest.dump());
  for (const PipelineStageInfo &stage : bundle.pipeline()->stages) {
    EXPECT_TRUE(stage.auxLoss);
    EXPECT_EQ(stage.reportedLosses,
              (std::vector<std::string>{"load_balancing_loss", "z_loss"}));
    EXPECT_EQ(stage.leadingOutputs(), 4u);
  }
  Json noAux = base.manifest;
  noAux["pipeline"]["stages"][0].erase("aux_loss");
  std::string message = refusal(noAux);
  EXPECT_NE(message.find("pipeline.stages[0].reported_losses: found "
                         "reported_losses without aux_loss"),
            std::string::npos)
      << message;
  Json twice = base.manifest;
  twice["pipeline"]["stages"][1]["reported_losses"][1] = "load_balancing_loss";
  message = refusal(twice);
  EXPECT_NE(message.find("distinct names"), std::string::npos) << message;
}

/// The JSON Schema type of an attribute of the op table.
std::string schemaType(bundle_detail::AttrKind kind) {
  switch (kind) {
  case bundle_detail::AttrKind::Int:
    return "integer";
  case bundle_detail::AttrKind::Number:
    return "number";
  case bundle_detail::AttrKind::Bool:
    return "boolean";
  case bundle_detail::AttrKind::String:
    return "string";
  case bundle_detail::AttrKind::IntArray:
  case bundle_detail::AttrKind::AxesList:
    return "array";
  }
  return "";
}

TEST(BundleManifestSchemaTest, TheOpTableHasTheSchemasOpsAndAttributes) {
  const Json &instruction = schema()["$defs"]["instruction"];
  std::set<std::string> schemaOps;
  for (const Json &op : instruction["properties"]["op"]["enum"])
    schemaOps.insert(op.get<std::string>());
  std::set<std::string> tableOps;
  const Json &attrs = schema()["$defs"]["attrs"]["properties"];
  for (const bundle_detail::OpInfo &info : bundle_detail::opTable()) {
    tableOps.insert(info.name);
    for (const bundle_detail::AttrSpec &spec : info.attrs) {
      ASSERT_TRUE(attrs.contains(spec.name))
          << info.name << "'s attribute " << spec.name
          << " is not in the schema's $defs.attrs";
      const Json &property = resolve(attrs[spec.name]);
      std::string type = property.value("type", "");
      if (type.empty() && property.contains("enum"))
        type = "string";
      EXPECT_EQ(type, schemaType(spec.kind))
          << info.name << "'s attribute " << spec.name;
    }
  }
  EXPECT_EQ(tableOps, schemaOps);
}

} // namespace
