//===- SchemaDocCheck.cpp - docs/BundleFormat.md against the schema -------===//

#include "SchemaDocCheck.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/Regex.h"

using namespace llvm;
using namespace megatron::bundle_schema;

/// The identifiers written `like_this` in `text`.
static std::vector<std::string> backticked(StringRef text) {
  std::vector<std::string> names;
  Regex name("^`([a-z_][a-z0-9_]*)`");
  for (size_t at = text.find('`'); at != StringRef::npos;
       at = text.find('`', at + 1)) {
    SmallVector<StringRef, 2> match;
    if (name.match(text.drop_front(at), &match)) {
      names.push_back(match[1].str());
      at += match[0].size() - 1;
    }
  }
  return names;
}

/// `cell` without its parenthesized remarks and the ops it refers to ("as
/// `attention`"): what is left names attributes.
static std::string attributeText(StringRef cell) {
  std::string text;
  int depth = 0;
  for (char c : cell) {
    depth += c == '(';
    if (depth == 0)
      text += c;
    depth -= c == ')' && depth > 0;
  }
  Regex reference("as `[a-z_]+`");
  while (reference.match(text))
    text = reference.sub("", text);
  return text;
}

std::vector<std::string>
megatron::bundle_schema::checkDocument(const ManifestSchema &schema,
                                       StringRef text) {
  std::vector<std::string> errors;
  for (const SchemaKey &key : schema.keys())
    if (!text.contains("`" + key.name + "`") &&
        !text.contains("\"" + key.name + "\""))
      errors.push_back("the key \"" + key.name + "\" of " + key.object +
                       " (format version " + std::to_string(key.sinceVersion) +
                       ") is in the schema but not in the page; document it");

  std::set<std::string> keyNames;
  for (const SchemaKey &key : schema.keys())
    keyNames.insert(key.name);
  std::set<std::string> attributes = schema.attributeNames();
  std::set<std::string> ops = schema.opNames();
  std::set<std::string> documentedOps;
  Regex jsonKey("\"([a-z_][a-z0-9_]*)\"[ \t]*:");
  bool inJson = false;
  SmallVector<StringRef> lines;
  text.split(lines, '\n');
  for (auto [number, line] : llvm::enumerate(lines)) {
    std::string where = "line " + std::to_string(number + 1);
    if (line.starts_with("```")) {
      inJson = line == "```json";
      continue;
    }
    if (inJson) {
      SmallVector<StringRef, 2> match;
      for (StringRef rest = line; jsonKey.match(rest, &match);
           rest = rest.drop_front(rest.find(match[0]) + match[0].size()))
        if (!keyNames.count(match[1].str()))
          errors.push_back(where + ": the key \"" + match[1].str() +
                           "\" of a JSON example is not in the schema; add "
                           "it to docs/bundle-manifest.schema.json or correct "
                           "the example");
      continue;
    }
    // An op table's row: | `op`, `op` | operands | results | attrs |.
    if (!line.starts_with("| `"))
      continue;
    SmallVector<StringRef> cells;
    line.split(cells, '|');
    if (cells.size() < 5)
      continue;
    for (const std::string &op : backticked(cells[1])) {
      documentedOps.insert(op);
      if (!ops.count(op))
        errors.push_back(where + ": the op \"" + op +
                         "\" is not among the schema's instruction ops");
    }
    for (const std::string &attr : backticked(attributeText(cells[4])))
      if (!attributes.count(attr))
        errors.push_back(where + ": the attribute \"" + attr +
                         "\" is not among the schema's attrs");
  }
  for (const std::string &op : ops)
    if (!documentedOps.count(op))
      errors.push_back("the op \"" + op +
                       "\" is in the schema but in no op table of the page");

  std::string title = "# The bundle file format (version " +
                      std::to_string(schema.newestVersion()) + ")";
  if (!text.starts_with(title))
    errors.push_back("the page's title is not \"" + title +
                     "\", the schema's newest version");
  return errors;
}
