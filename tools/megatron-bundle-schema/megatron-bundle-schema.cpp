//===- megatron-bundle-schema.cpp - Checks manifests against the schema ---===//
//
// megatron-bundle-schema SCHEMA [--doc PAGE.md] [FILE...]
// validates each FILE (a bundle, or a manifest as JSON: `megatron-compile
// --emit plan`'s output, `-` for stdin) against the manifest's schema
// (docs/bundle-manifest.schema.json), and with --doc checks that the format's
// page names exactly the schema's keys. Exits 1 on any violation.
//
//===----------------------------------------------------------------------===//

#include "ManifestSchema.h"
#include "SchemaDocCheck.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/WithColor.h"

using namespace llvm;
using namespace megatron::bundle_schema;

static cl::opt<std::string> schemaPath(cl::Positional, cl::Required,
                                       cl::desc("<schema.json>"));
static cl::list<std::string> inputs(cl::Positional,
                                    cl::desc("<bundle.mtb|manifest.json>..."));
static cl::opt<std::string>
    docPath("doc",
            cl::desc("check this page (docs/BundleFormat.md) against "
                     "the schema"),
            cl::value_desc("page.md"));

/// The manifest text of `bytes`: a bundle's (after the 64-byte header of
/// docs/BundleFormat.md), or the whole text of a JSON manifest.
static Expected<StringRef> manifestText(StringRef bytes) {
  if (!bytes.starts_with("MTBUNDLE"))
    return bytes;
  if (bytes.size() < 64)
    return createStringError(inconvertibleErrorCode(),
                             "a bundle shorter than its 64-byte header");
  uint64_t length = support::endian::read64le(bytes.data() + 16);
  if (length > bytes.size() - 64)
    return createStringError(inconvertibleErrorCode(),
                             "a manifest length past the end of the file");
  return bytes.substr(64, length);
}

static bool validateFile(const ManifestSchema &schema, StringRef path) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buffer =
      MemoryBuffer::getFileOrSTDIN(path);
  if (!buffer) {
    WithColor::error() << path << ": " << buffer.getError().message() << "\n";
    return false;
  }
  Expected<StringRef> text = manifestText((*buffer)->getBuffer());
  Expected<json::Value> manifest =
      text ? json::parse(*text) : Expected<json::Value>(text.takeError());
  if (!manifest) {
    WithColor::error() << path << ": " << toString(manifest.takeError())
                       << "\n";
    return false;
  }
  int64_t objects = 0, keys = 0;
  std::vector<std::string> errors = schema.validate(*manifest, objects, keys);
  for (const std::string &error : errors)
    WithColor::error() << path << ": " << error << "\n";
  if (errors.empty())
    outs() << path << ": valid, " << objects << " objects, " << keys
           << " keys\n";
  return errors.empty();
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(
      argc, argv,
      "checks bundle manifests and docs/BundleFormat.md against the "
      "manifest's schema\n");
  Expected<ManifestSchema> schema = ManifestSchema::load(schemaPath);
  if (!schema) {
    WithColor::error() << toString(schema.takeError()) << "\n";
    return 1;
  }
  bool ok = true;
  if (!docPath.empty()) {
    ErrorOr<std::unique_ptr<MemoryBuffer>> page =
        MemoryBuffer::getFile(docPath);
    if (!page) {
      WithColor::error() << docPath << ": " << page.getError().message()
                         << "\n";
      return 1;
    }
    std::vector<std::string> errors =
        checkDocument(*schema, (*page)->getBuffer());
    for (const std::string &error : errors)
      WithColor::error() << docPath << ": " << error << "\n";
    if (errors.empty())
      outs() << docPath << ": documents the schema's " << schema->keys().size()
             << " keys and " << schema->opNames().size() << " ops\n";
    ok &= errors.empty();
  }
  for (const std::string &input : inputs)
    ok &= validateFile(*schema, input);
  return ok ? 0 : 1;
}
