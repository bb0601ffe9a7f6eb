// JSON Schema -> Grammar (grammar.h): the structured-output grammars of `response_format` json_schema / json_object.
//
// Supported (everything else that constrains values is rejected with an Error naming the keyword and its JSON
// pointer, e.g. "unsupported JSON Schema keyword 'pattern' at /properties/name"):
//   type (one name or a list), object properties / required / additionalProperties (false, true or a schema), enum,
//   const, array items (a schema) with minItems / maxItems, anyOf and oneOf (both as "any of": oneOf's exclusivity is
//   not enforced), allOf with one element, $ref to "#", "#/$defs/..." or "#/definitions/..." (recursive references
//   are fine as long as they consume text first), string minLength / maxLength (code points), string format date,
//   time, date-time (RFC 3339), uuid, email (a practical subset: local@domain.tld); integer `minimum` / `maximum` /
//   `exclusiveMinimum` / `exclusiveMaximum` are enforced exactly when both ends are given and span at most 1024
//   values (the decimal texts of the range, as a trie); otherwise `minimum` >= 0 removes the minus sign and the other
//   numeric bounds (and multipleOf, and all bounds of `number`) are accepted and NOT enforced.
//   Annotations (title, description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly,
//   and unknown keywords) are ignored.
// Output shape:
//   - Object members come in the order of `properties`; required ones must appear, optional ones may be left out;
//     additional members (when allowed) come after the declared ones and their names are not checked against them.
//   - additionalProperties absent: false when the schema has `properties` (OpenAI strict-mode behaviour), any member
//     when it has none (so {"type": "object"} is any object).
//   - A schema with no type and no other constraint is any JSON value.
//   - Strings: valid UTF-8, control characters escaped, \u escapes of surrogates not allowed (write the character).
//   - Numbers: JSON syntax (no leading zeros, no '+', no NaN/Infinity), bounded so that every parser reads them
//     exactly: an integer part of at most 18 digits (an int64), an exponent of at most 2 digits (a finite double).
// Whitespace (bounded, what models emit): between tokens (after '{', '[', ',', ':' and before '}', ']', ':'), either
// nothing, one space, or one newline followed by at most 20 spaces. Nothing before the value or after it.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace flashnext::grammar {

/// Options of the compiler.
struct JsonSchemaOptions {
  int max_indent = 20;             ///< most spaces after a newline between tokens
  int64_t max_repeat = 4096;       ///< largest minItems / maxItems / minLength / maxLength compiled exactly (Error above)
  size_t max_states = 2000000;     ///< builder size limit (Error above: the schema is too large)
};

/// Compiles `schema` (a JSON Schema document: an object or `true`; members in document order) to a grammar whose
/// root rule matches exactly the JSON texts described above. Throws Error naming the feature and its JSON pointer
/// ("#/properties/name") for anything unsupported (including a `required` name missing from `properties`), and for
/// invalid schemas (wrong keyword types, an unresolved $ref, an empty enum, minLength > maxLength, left-recursive
/// $refs, `false`, more than max_states states, ...).
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const JsonSchemaOptions& options = {});

/// The same for a nlohmann::json document, whose objects are sorted by key: properties then come in key order.
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, const JsonSchemaOptions& options = {});

/// Parses `schema_text` as JSON (keeping member order) and compiles it; a parse failure throws Error too.
std::shared_ptr<const Grammar> compile_json_schema(std::string_view schema_text, const JsonSchemaOptions& options = {});
/// The same for a C string (which would otherwise convert to both JSON types).
inline std::shared_ptr<const Grammar> compile_json_schema(const char* schema_text, const JsonSchemaOptions& options = {}) {
  return compile_json_schema(std::string_view(schema_text), options);
}

/// `key` escaped as one JSON-pointer reference token (RFC 6901: "~" -> "~0", "/" -> "~1"), for pointers such as
/// "/properties/" + json_pointer_token(name).
std::string json_pointer_token(const std::string& key);

/// Compiles the schema at JSON pointer `pointer` ("" = the whole document, "/properties/city", ...) of `root` into
/// rules of `builder`, which may hold rules of other grammars (tool-call grammars put one schema per parameter into
/// one grammar), and returns the id of the rule that matches its JSON texts. `$ref`s resolve inside `root`. `root`
/// must outlive the call only. Throws Error as compile_json_schema, and when `pointer` does not resolve.
int32_t add_json_schema(GrammarBuilder& builder, const nlohmann::ordered_json& root, const std::string& pointer,
                        const JsonSchemaOptions& options = {});

/// The grammar of `response_format: {"type": "json_object"}`: any JSON object (same whitespace rules).
std::shared_ptr<const Grammar> json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace flashnext::grammar
