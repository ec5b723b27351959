//===- SchemaDocCheck.h - docs/BundleFormat.md against the schema ---------===//
#ifndef MEGATRON_TOOLS_BUNDLESCHEMA_SCHEMADOCCHECK_H
#define MEGATRON_TOOLS_BUNDLESCHEMA_SCHEMADOCCHECK_H

#include "ManifestSchema.h"

namespace megatron::bundle_schema {

/// The disagreements between the format's page and the schema: a schema
/// key the page never names (`key` or "key"), a key of the page's JSON
/// examples or an attribute of its op tables that the schema lacks, an op
/// in one and not the other, a version other than the schema's newest.
std::vector<std::string> checkDocument(const ManifestSchema &schema,
                                       llvm::StringRef text);

} // namespace megatron::bundle_schema

#endif
