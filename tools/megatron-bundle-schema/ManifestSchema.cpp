//===- ManifestSchema.cpp - Validates manifests against their schema ------===//

#include "ManifestSchema.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;
using namespace megatron::bundle_schema;

/// The JSON Schema keywords this validator implements; annotations
/// (description, x-since-version) are checked for form only.
static const StringSet<> kKeywords = {
    "$schema", "$id",         "$defs",          "$ref",
    "title",   "description", "type",           "const",
    "enum",    "properties",  "required",       "additionalProperties",
    "items",   "minItems",    "maxItems",       "minimum",
    "maximum", "minLength",   "x-since-version"};

static std::string member(const std::string &path, StringRef key) {
  return path + "." + key.str();
}

static std::string index(const std::string &path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

static std::string show(const json::Value &value) {
  std::string text;
  raw_string_ostream(text) << value;
  return text.size() > 60 ? text.substr(0, 60) + "..." : text;
}

Expected<ManifestSchema> ManifestSchema::load(StringRef path) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buffer = MemoryBuffer::getFile(path);
  if (!buffer)
    return createStringError(buffer.getError(),
                             "cannot read the schema '" + path + "'");
  Expected<json::Value> parsed = json::parse((*buffer)->getBuffer());
  if (!parsed)
    return createStringError(inconvertibleErrorCode(),
                             "the schema '" + path + "' is not JSON: " +
                                 toString(parsed.takeError()));
  ManifestSchema schema(std::move(*parsed));
  const json::Object *top = schema.root.getAsObject();
  if (!top)
    return createStringError(inconvertibleErrorCode(),
                             "the schema '" + path + "' is not an object");
  if (Error error = schema.checkSubset(*top, "schema", "manifest"))
    return std::move(error);
  if (const json::Object *defs = top->getObject("$defs"))
    for (const auto &[name, definition] : *defs) {
      const json::Object *object = definition.getAsObject();
      if (!object)
        return createStringError(inconvertibleErrorCode(),
                                 "schema $defs." + name.str() +
                                     " is not an object");
      if (Error error =
              schema.checkSubset(*object, "$defs." + name.str(), name))
        return std::move(error);
    }
  return schema;
}

/// Refuses keywords outside the subset, and collects the keys of every
/// object schema, each with its x-since-version.
Error ManifestSchema::checkSubset(const json::Object &schema,
                                  const std::string &where, StringRef object) {
  auto fail = [&](const Twine &message) {
    return createStringError(inconvertibleErrorCode(),
                             "schema " + where + ": " + message);
  };
  for (const auto &[keyword, value] : schema) {
    if (!kKeywords.contains(keyword))
      return fail("the keyword \"" + keyword +
                  "\" is outside the subset megatron-bundle-schema validates "
                  "(" +
                  "type, const, enum, properties, required, "
                  "additionalProperties, items, minItems, maxItems, minimum, "
                  "maximum, minLength, $ref, $defs); use those or extend the "
                  "validator");
    if (keyword == "$ref") {
      StringRef ref = *value.getAsString();
      if (!ref.starts_with("#/$defs/") ||
          !root.getAsObject()->getObject("$defs")->getObject(ref.drop_front(8)))
        return fail("\"$ref\": \"" + ref + "\" is not a #/$defs/ entry");
    }
    if (keyword == "additionalProperties" &&
        value.getAsBoolean() != std::optional<bool>(false))
      return fail("additionalProperties is false on every object (every "
                  "object of the manifest is closed)");
  }
  if (const json::Value *type = schema.get("type"))
    if (type->getAsString() == StringRef("object") &&
        !schema.get("additionalProperties"))
      return fail("an object without \"additionalProperties\": false");
  if (const json::Object *items = schema.getObject("items"))
    if (Error error = checkSubset(*items, where + ".items", object))
      return error;
  const json::Object *properties = schema.getObject("properties");
  if (!properties)
    return Error::success();
  for (const auto &[name, property] : *properties) {
    const json::Object *body = property.getAsObject();
    std::optional<int64_t> since =
        body ? body->getInteger("x-since-version") : std::nullopt;
    if (!since || *since < 1)
      return fail("properties." + name +
                  " needs \"x-since-version\": the format version that "
                  "introduced it");
    allKeys.push_back({object.str(), name.str(), *since});
    if (Error error =
            checkSubset(*body, where + ".properties." + name.str(), object))
      return error;
  }
  if (const json::Array *required = schema.getArray("required"))
    for (const json::Value &name : *required)
      if (!properties->get(*name.getAsString()))
        return fail("\"required\" lists \"" + *name.getAsString() +
                    "\", which is not among its properties");
  return Error::success();
}

const json::Object *ManifestSchema::resolve(StringRef ref) const {
  return root.getAsObject()->getObject("$defs")->getObject(ref.drop_front(8));
}

const json::Object &ManifestSchema::definition(StringRef name) const {
  return *root.getAsObject()->getObject("$defs")->getObject(name);
}

static bool hasType(const json::Value &value, StringRef type) {
  if (type == "object")
    return value.getAsObject();
  if (type == "array")
    return value.getAsArray();
  if (type == "string")
    return value.getAsString().has_value();
  if (type == "boolean")
    return value.getAsBoolean().has_value();
  if (type == "integer")
    return value.getAsInteger().has_value() || value.getAsUINT64().has_value();
  if (type == "number")
    return value.getAsNumber().has_value();
  return false;
}

void ManifestSchema::check(const json::Value &value, const json::Object &schema,
                           const std::string &path, int64_t version,
                           std::vector<std::string> &errors, int64_t &objects,
                           int64_t &keys) const {
  auto fail = [&](const std::string &where, const Twine &message) {
    errors.push_back(where + ": " + message.str());
  };
  if (const json::Value *ref = schema.get("$ref"))
    check(value, *resolve(*ref->getAsString()), path, version, errors, objects,
          keys);
  if (const json::Value *constant = schema.get("const"))
    if (value != *constant)
      fail(path, "found " + show(value) + ", expected " + show(*constant));
  if (const json::Array *choices = schema.getArray("enum"))
    if (llvm::find(*choices, value) == choices->end())
      fail(path, "found " + show(value) + ", expected one of " +
                     show(json::Value(json::Array(*choices))));
  if (std::optional<StringRef> type = schema.getString("type"))
    if (!hasType(value, *type)) {
      fail(path,
           "found " + show(value) + ", expected a value of type " + *type);
      return;
    }
  if (std::optional<double> minimum = schema.getNumber("minimum"))
    if (value.getAsNumber() && *value.getAsNumber() < *minimum)
      fail(path, "found " + show(value) + ", expected at least " +
                     show(*schema.get("minimum")));
  if (std::optional<double> maximum = schema.getNumber("maximum"))
    if (value.getAsNumber() && *value.getAsNumber() > *maximum)
      fail(path, "found " + show(value) + ", expected at most " +
                     show(*schema.get("maximum")));
  if (std::optional<int64_t> minLength = schema.getInteger("minLength"))
    if (value.getAsString() &&
        static_cast<int64_t>(value.getAsString()->size()) < *minLength)
      fail(path, "found " + show(value) + ", expected at least " +
                     Twine(*minLength) + " characters");
  if (const json::Array *array = value.getAsArray()) {
    if (std::optional<int64_t> minItems = schema.getInteger("minItems"))
      if (static_cast<int64_t>(array->size()) < *minItems)
        fail(path, "found " + Twine(array->size()) +
                       " items, expected at least " + Twine(*minItems));
    if (std::optional<int64_t> maxItems = schema.getInteger("maxItems"))
      if (static_cast<int64_t>(array->size()) > *maxItems)
        fail(path, "found " + Twine(array->size()) +
                       " items, expected at most " + Twine(*maxItems));
    if (const json::Object *items = schema.getObject("items"))
      for (size_t i = 0; i < array->size(); ++i)
        check((*array)[i], *items, index(path, i), version, errors, objects,
              keys);
  }
  const json::Object *object = value.getAsObject();
  const json::Object *properties = schema.getObject("properties");
  if (!object || !properties)
    return;
  ++objects;
  if (const json::Array *required = schema.getArray("required"))
    for (const json::Value &name : *required)
      if (!object->get(*name.getAsString()))
        fail(member(path, *name.getAsString()),
             "missing, expected this required key");
  for (const auto &[name, field] : *object) {
    ++keys;
    const json::Object *property = properties->getObject(name);
    if (!property) {
      std::set<std::string> names; // json::Object's order is a hash's.
      for (const auto &[other, unused] : *properties)
        names.insert(other.str());
      std::string known;
      for (const std::string &other : names)
        known += (known.empty() ? "" : ", ") + other;
      fail(member(path, name),
           "an unknown key, expected one of the schema's: " + known);
      continue;
    }
    std::optional<int64_t> since = property->getInteger("x-since-version");
    if (since && *since > version)
      fail(member(path, name), "a key of format version " + Twine(*since) +
                                   " in a version " + Twine(version) +
                                   " manifest");
    check(field, *property, member(path, name), version, errors, objects, keys);
  }
}

std::vector<std::string> ManifestSchema::validate(const json::Value &manifest,
                                                  int64_t &objects,
                                                  int64_t &keys) const {
  std::vector<std::string> errors;
  objects = keys = 0;
  // Keys newer than the manifest's version are refused; a manifest without
  // a version is refused for that, and checked as the newest.
  const json::Object *top = manifest.getAsObject();
  int64_t version = top && top->getInteger("version")
                        ? *top->getInteger("version")
                        : newestVersion();
  check(manifest, *root.getAsObject(), "manifest", version, errors, objects,
        keys);
  return errors;
}

static std::set<std::string> enumOf(const json::Object &property) {
  std::set<std::string> names;
  if (const json::Array *choices = property.getArray("enum"))
    for (const json::Value &choice : *choices)
      names.insert(choice.getAsString()->str());
  return names;
}

std::set<std::string> ManifestSchema::opNames() const {
  return enumOf(
      *definition("instruction").getObject("properties")->getObject("op"));
}

std::set<std::string> ManifestSchema::attributeNames() const {
  std::set<std::string> names;
  for (const auto &[name, unused] :
       *definition("attrs").getObject("properties"))
    names.insert(name.str());
  return names;
}

int64_t ManifestSchema::newestVersion() const {
  return root.getAsObject()
      ->getObject("properties")
      ->getObject("version")
      ->getInteger("maximum")
      .value_or(0);
}
