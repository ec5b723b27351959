//===- ManifestSchema.h - The bundle manifest's schema, as a validator ----===//
//
// Loads docs/bundle-manifest.schema.json and validates manifests against it.
// The schema is JSON Schema draft 2020-12 restricted to the keywords below;
// loading refuses any other keyword, so a schema that says more than this
// validator checks cannot pass unnoticed.
//
//===----------------------------------------------------------------------===//
#ifndef MEGATRON_TOOLS_BUNDLESCHEMA_MANIFESTSCHEMA_H
#define MEGATRON_TOOLS_BUNDLESCHEMA_MANIFESTSCHEMA_H

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <set>
#include <string>
#include <vector>

namespace megatron::bundle_schema {

/// One key of one object of the manifest, as the schema lists it.
struct SchemaKey {
  std::string object; ///< "manifest", or the $defs name ("parameter").
  std::string name;
  int64_t sinceVersion;
};

class ManifestSchema {
public:
  static llvm::Expected<ManifestSchema> load(llvm::StringRef path);

  /// Every violation of `manifest`, one message each ("PATH: problem"),
  /// keys newer than its `version` included.
  /// `objects` and `keys` count what was checked.
  std::vector<std::string> validate(const llvm::json::Value &manifest,
                                    int64_t &objects, int64_t &keys) const;

  /// Every key of every object the schema describes.
  const std::vector<SchemaKey> &keys() const { return allKeys; }
  /// The `op` names of an instruction.
  std::set<std::string> opNames() const;
  /// The keys an instruction's `attrs` may hold.
  std::set<std::string> attributeNames() const;
  /// The newest format version (the manifest's `version` maximum).
  int64_t newestVersion() const;

private:
  explicit ManifestSchema(llvm::json::Value root) : root(std::move(root)) {}
  llvm::Error checkSubset(const llvm::json::Object &schema,
                          const std::string &where, llvm::StringRef object);
  const llvm::json::Object *resolve(llvm::StringRef ref) const;
  /// `version`: the manifest's format version, which bounds its keys'.
  void check(const llvm::json::Value &value, const llvm::json::Object &schema,
             const std::string &path, int64_t version,
             std::vector<std::string> &errors, int64_t &objects,
             int64_t &keys) const;
  const llvm::json::Object &definition(llvm::StringRef name) const;

  llvm::json::Value root;
  std::vector<SchemaKey> allKeys;
};

} // namespace megatron::bundle_schema

#endif
