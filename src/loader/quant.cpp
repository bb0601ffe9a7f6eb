#include "loader/quant.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "loader/tensor_plan.h"

namespace flashnext {

namespace fs = std::filesystem;
using json = nlohmann::json;

float e2m1_to_float(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7u];
  return (code & 8u) ? -m : m;
}

namespace {

bool is_float(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---------------------------------------------------------------- config parsing

// Typed field access with errors naming the file and the field.
struct Fields {
  const json& obj;
  std::string where;  // "config.json: quantization_config"

  const json* find(const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  std::string str(const char* key, const std::string& dflt = "") const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_string()) fail("{}.{} must be a string, got {}", where, key, v->dump());
    return v->get<std::string>();
  }
  int64_t integer(const char* key, int64_t dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_number_integer()) fail("{}.{} must be an integer, got {}", where, key, v->dump());
    return v->get<int64_t>();
  }
  bool boolean(const char* key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail("{}.{} must be true or false, got {}", where, key, v->dump());
    return v->get<bool>();
  }
  std::vector<std::string> strings(const char* key) const {
    const json* v = find(key);
    std::vector<std::string> out;
    if (!v) return out;
    if (!v->is_array()) fail("{}.{} must be a list of strings, got {}", where, key, v->dump());
    for (const json& s : *v) {
      if (!s.is_string()) fail("{}.{} must be a list of strings, got {}", where, key, v->dump());
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  const json* object(const char* key) const {
    const json* v = find(key);
    if (v && !v->is_object()) fail("{}.{} must be an object, got {}", where, key, v->dump());
    return v;
  }
};

constexpr const char* kModelOptAlgos = "NVFP4, MIXED_PRECISION";
constexpr const char* kModelOptLayerAlgos = "NVFP4, FP8, FP8_PB_WO";

void parse_modelopt(const json* qc, const json* hf, const std::string& source, QuantConfig& q) {
  const json empty = json::object();
  const Fields c{qc ? *qc : empty, "config.json: quantization_config"};
  const Fields h{hf ? *hf : empty, "hf_quant_config.json: quantization"};
  const std::string a_cfg = c.str("quant_algo"), a_hf = h.str("quant_algo");
  if (!a_cfg.empty() && !a_hf.empty() && a_cfg != a_hf) {
    fail("{}: quant_algo disagrees: config.json says '{}', hf_quant_config.json says '{}'", source, a_cfg, a_hf);
  }
  q.algo = a_hf.empty() ? a_cfg : a_hf;
  if (q.algo != "NVFP4" && q.algo != "MIXED_PRECISION") {
    fail("{}: unknown ModelOpt quant_algo '{}' (supported: {})", source, q.algo, kModelOptAlgos);
  }
  const Fields& src = hf ? h : c;
  if (const json* kv = src.find("kv_cache_quant_algo")) {
    fail("{}.kv_cache_quant_algo is {}: quantized KV caches are not supported (expected null)", src.where, kv->dump());
  }
  q.exclude_modules = hf ? h.strings("exclude_modules") : c.strings("ignore");
  q.group_size = src.integer("group_size", 16);
  if (q.algo == "NVFP4" && q.group_size != 16) {
    fail("{}.group_size is {}: NVFP4 scales one E4M3 value per 16 inputs (expected 16)", src.where, q.group_size);
  }
  const json* layers = src.object("quantized_layers");
  if (!layers && hf) layers = c.object("quantized_layers");
  if (q.algo == "MIXED_PRECISION") {
    if (!layers || layers->empty()) fail("{}: quant_algo MIXED_PRECISION needs a non-empty quantized_layers", source);
    for (const auto& [module, spec] : layers->items()) {
      const Fields f{spec, src.where + ".quantized_layers." + module};
      if (!spec.is_object()) fail("{} must be an object, got {}", f.where, spec.dump());
      const std::string algo = f.str("quant_algo");
      if (algo != "NVFP4" && algo != "FP8" && algo != "FP8_PB_WO") {
        fail("{}: unknown quant_algo '{}' (supported in quantized_layers: {})", f.where, algo, kModelOptLayerAlgos);
      }
      if (algo == "NVFP4" && f.integer("group_size", 16) != 16) {
        fail("{}.group_size is {}: NVFP4 uses groups of 16", f.where, f.integer("group_size", 16));
      }
      q.quantized_layers.emplace_back(module, algo);
    }
  }
}

void parse_fp8(const Fields& c, QuantConfig& q) {
  const json* b = c.find("weight_block_size");
  if (!b) {
    fail(
        "{}: quant_method fp8 without weight_block_size (per-tensor FP8) is not supported; expected "
        "weight_block_size [128, 128]",
        c.where);
  }
  if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
      (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0) {
    fail("{}.weight_block_size must be two positive integers [rows, cols], got {}", c.where, b->dump());
  }
  q.block_rows = (*b)[0].get<int64_t>();
  q.block_cols = (*b)[1].get<int64_t>();
  if (c.boolean("weight_per_tensor", false)) fail("{}.weight_per_tensor true is not supported", c.where);
}

void parse_compressed_tensors(const Fields& c, QuantConfig& q) {
  q.ct_format = c.str("format");
  if (const json* kv = c.find("kv_cache_scheme")) {
    fail("{}.kv_cache_scheme is {}: quantized KV caches are not supported (expected null)", c.where, kv->dump());
  }
  if (const json* sp = c.object("sparsity_config"); sp && !sp->empty() && sp->value("format", "dense") != "dense") {
    fail("{}.sparsity_config {}: sparse-compressed checkpoints are not supported", c.where, sp->dump());
  }
  const json* groups = c.object("config_groups");
  if (!groups || groups->empty()) fail("{}: compressed-tensors config without config_groups", c.where);
  for (const auto& [name, g] : groups->items()) {
    const Fields f{g, c.where + ".config_groups." + name};
    if (!g.is_object()) fail("{} must be an object, got {}", f.where, g.dump());
    const json* w = f.object("weights");
    if (!w) continue;  // activation-only group: no weight format
    const Fields wf{*w, f.where + ".weights"};
    CtGroup cg;
    cg.name = name;
    cg.targets = f.strings("targets");
    cg.format = f.str("format", q.ct_format);
    cg.num_bits = wf.integer("num_bits", 0);
    cg.type = wf.str("type", "int");
    cg.strategy = wf.str("strategy", "group");
    cg.group_size = wf.integer("group_size", 0);
    cg.symmetric = wf.boolean("symmetric", true);
    if (const json* ao = wf.find("actorder"); ao && !(ao->is_boolean() && !ao->get<bool>())) {
      const std::string s = ao->is_string() ? ao->get<std::string>() : ao->dump();
      if (s != "weight" && s != "static") {
        fail("{}.actorder is {}: activation ordering with a stored g_idx is not supported", wf.where, ao->dump());
      }
    }
    if (cg.format == "pack-quantized") {
      if (cg.num_bits != 4 || cg.type != "int" || (cg.strategy != "group" && cg.strategy != "channel") ||
          (cg.strategy == "group" && cg.group_size <= 0)) {
        fail(
            "{}: pack-quantized weights of {} bits, type '{}', strategy '{}', group_size {} are not supported "
            "(supported: 4-bit int, strategy group with group_size > 0, or channel)",
            wf.where, cg.num_bits, cg.type, cg.strategy, cg.group_size);
      }
      if (cg.strategy == "channel") cg.group_size = 0;
    } else if (cg.format == "int-quantized" || cg.format == "float-quantized") {
      // W8A8 releases: 8-bit weights with a scale per output channel or per tensor; flashnext reads the weights
      // only (weight-only W8A16: the activations' quantization is not applied).
      const bool is_int = cg.format == "int-quantized";
      if (cg.num_bits != 8 || cg.type != (is_int ? "int" : "float") ||
          (cg.strategy != "channel" && cg.strategy != "tensor") || !cg.symmetric) {
        fail(
            "{}: {} weights of {} bits, type '{}', strategy '{}', symmetric {} are not supported (supported: 8-bit "
            "{}, symmetric, strategy channel or tensor)",
            wf.where, cg.format, cg.num_bits, cg.type, cg.strategy, cg.symmetric, is_int ? "int" : "float");
      }
      cg.group_size = 0;
    } else if (cg.format == "nvfp4-pack-quantized") {
      if (cg.num_bits != 4 || cg.type != "float" || cg.group_size != 16) {
        fail(
            "{}: nvfp4-pack-quantized weights must be 4-bit float with group_size 16, got {} bits, type '{}', "
            "group_size {}",
            wf.where, cg.num_bits, cg.type, cg.group_size);
      }
    } else {
      fail(
          "{}: unknown compressed-tensors format '{}' (supported: pack-quantized, nvfp4-pack-quantized, "
          "int-quantized, float-quantized)",
          f.where, cg.format);
    }
    q.ct_groups.push_back(std::move(cg));
  }
  if (q.ct_groups.empty()) fail("{}: no config group quantizes weights", c.where);
}

bool gptq_bits_ok(int64_t b) {
  return b == 2 || b == 3 || b == 4 || b == 8;
}

// `group_size` of a GPTQ / AutoRound config or entry: -1 (one group spans K) is stored as 0.
int64_t group_size_field(const Fields& c, int64_t fallback) {
  int64_t g = c.integer("group_size", fallback);
  if (g == -1) g = 0;
  if (g < 0) fail("{}.group_size must be positive or -1, got {}", c.where, g);
  return g;
}

// An AutoRound extra_config key that is a regex rather than a module name (AutoRound itself: a key that names no
// module; here: one with a regex metacharacter, since dots appear in names too).
bool is_regex_key(const std::string& key) {
  return key.find_first_of("*+?[]()|^$\\") != std::string::npos;
}

void parse_gptq(const Fields& c, QuantConfig& q) {
  q.bits = c.integer("bits", 4);
  if (!gptq_bits_ok(q.bits)) fail("{}.bits is {}: GPTQ packings of 2, 3, 4 or 8 bits are supported", c.where, q.bits);
  q.group_size = group_size_field(c, 128);
  q.desc_act = c.boolean("desc_act", false);
  if (q.desc_act) {
    fail("{}.desc_act is true: GPTQ activation order (a permuting g_idx) is not supported; expected false", c.where);
  }
  const std::string fmt_ = c.str("checkpoint_format", "gptq");
  if (fmt_ != "gptq" && fmt_ != "gptq_v2") {
    fail("{}.checkpoint_format '{}' is not supported (expected gptq or gptq_v2)", c.where, fmt_);
  }
  q.gptq_v2 = fmt_ == "gptq_v2";
  if (const json* dyn = c.object("dynamic")) {
    for (const auto& [key, spec] : dyn->items()) {
      GptqRule r;
      r.exclude = key.rfind("-:", 0) == 0;
      r.pattern = key.rfind("-:", 0) == 0 || key.rfind("+:", 0) == 0 ? key.substr(2) : key;
      if (!r.exclude) {
        if (!spec.is_object()) fail("{}.dynamic.{} must be an object, got {}", c.where, key, spec.dump());
        const Fields f{spec, c.where + ".dynamic." + key};
        r.bits = f.integer("bits", 0);
        if (r.bits && !gptq_bits_ok(r.bits)) {
          fail("{}.bits is {}: GPTQ packings of 2, 3, 4 or 8 bits are supported", f.where, r.bits);
        }
        r.group_size = f.integer("group_size", 0);
        if (f.boolean("desc_act", false)) fail("{}.desc_act true is not supported", f.where);
      }
      try {
        std::regex re(r.pattern);
      } catch (const std::regex_error&) {
        fail("{}.dynamic: '{}' is not a valid regular expression", c.where, key);
      }
      q.gptq_dynamic.push_back(std::move(r));
    }
  }
}

// AutoRound (auto_round's export; vLLM / SGLang AutoRoundConfig): bits, group_size, sym, packing_format
// "auto_round:auto_gptq" (GPTQ v1 packing; the default) or "auto_round:auto_awq" (AutoAWQ's GEMM packing, 4 bits:
// vLLM reads it as AWQ with zero_point = not sym), data_type "int", and extra_config: per module name its own bits
// (16 or more: not quantized), group_size and sym.
void parse_auto_round(const Fields& c, QuantConfig& q) {
  const std::string packing = c.str("packing_format", "auto_round:auto_gptq");
  if (packing != "auto_round:auto_gptq" && packing != "auto_round:auto_awq") {
    fail(
        "{}.packing_format is '{}': 'auto_round:auto_gptq' (GPTQ packing) or 'auto_round:auto_awq' (AutoAWQ GEMM "
        "packing) are supported",
        c.where, packing);
  }
  q.auto_round_awq = packing == "auto_round:auto_awq";
  // The bits an entry may take with this packing (16 or more: not quantized).
  auto bits_ok = [&](int64_t b) { return q.auto_round_awq ? b == 4 : gptq_bits_ok(b); };
  const char* supported = q.auto_round_awq ? "AutoRound's AWQ packing holds 4 bits"
                                           : "AutoRound packings of 2, 3, 4 or 8 bits are supported";
  q.bits = c.integer("bits", 4);
  if (!bits_ok(q.bits)) fail("{}.bits is {}: {}", c.where, q.bits, supported);
  q.group_size = group_size_field(c, 128);
  q.auto_round_sym = c.boolean("sym", true);
  const std::string data_type = c.str("data_type", "int");
  if (data_type != "int")
    fail("{}.data_type is '{}': only integer AutoRound weights are supported", c.where, data_type);
  if (const json* extra = c.object("extra_config")) {
    for (const auto& [module, spec] : extra->items()) {
      if (!spec.is_object()) fail("{}.extra_config.{} must be an object, got {}", c.where, module, spec.dump());
      if (is_regex_key(module)) {
        try {
          std::regex re(module);
        } catch (const std::regex_error&) {
          fail("{}.extra_config: '{}' is not a valid regular expression", c.where, module);
        }
      }
      const Fields f{spec, c.where + ".extra_config." + module};
      AutoRoundLayer l;
      l.bits = f.integer("bits", q.bits);
      if (l.bits < 16 && !bits_ok(l.bits)) fail("{}.bits is {}: {} (or 16: unquantized)", f.where, l.bits, supported);
      l.sym = f.boolean("sym", q.auto_round_sym);
      l.group_size = group_size_field(f, q.group_size == 0 ? -1 : q.group_size);
      const std::string dt = f.str("data_type", "int");
      if (l.bits < 16 && dt != "int") fail("{}.data_type is '{}': only integer weights are supported", f.where, dt);
      q.auto_round_layers.emplace(module, l);
    }
  }
}

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// AutoAWQ (transformers AwqConfig.to_dict / AutoAWQ's to_transformers_dict): bits, group_size, zero_point, version,
// backend, modules_to_not_convert. AutoAWQ's own quant_config.json spells the first two w_bit / q_group_size (also
// read, as vLLM's AWQConfig does).
void parse_awq(const Fields& c, QuantConfig& q) {
  const char* bits_key = c.find("bits") || !c.find("w_bit") ? "bits" : "w_bit";
  q.bits = c.integer(bits_key, 4);
  if (q.bits != 4) fail("{}.{} is {}: only 4-bit AWQ is supported", c.where, bits_key, q.bits);
  const char* group_key = c.find("group_size") || !c.find("q_group_size") ? "group_size" : "q_group_size";
  q.group_size = c.integer(group_key, 128);
  if (q.group_size == -1) q.group_size = 0;
  if (q.group_size < 0) fail("{}.{} must be positive or -1, got {}", c.where, group_key, q.group_size);
  const std::string version = c.str("version", "gemm");
  if (lower(version) != "gemm") {
    fail(
        "{}.version is '{}': only AutoAWQ's GEMM packing (version gemm: qweight I32 [in, out/8]) is supported; "
        "gemv, gemv_fast, marlin, exllama and ipex checkpoints store other layouts",
        c.where, version);
  }
  const std::string backend = c.str("backend", "autoawq");
  if (lower(backend) != "autoawq") {
    fail("{}.backend is '{}': only AutoAWQ checkpoints (backend autoawq) are supported", c.where, backend);
  }
  q.awq_zero_point = c.boolean("zero_point", true);
  q.not_convert = c.strings("modules_to_not_convert");
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) fail("{}: cannot open", p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
}

// ---------------------------------------------------------------- tensors

// Element i of a little-endian array (the data may be unaligned).
template <class T>
T load(const TensorView& t, size_t i) {
  T v;
  std::memcpy(&v, t.data + i * sizeof(T), sizeof(T));
  return v;
}

std::vector<float> to_float(const TensorView& t) {
  std::vector<float> v(size_t(t.numel()));
  convert_to_float(t.dtype, t.data, v.data(), v.size());
  return v;
}

// Scalars are stored as shape [] or [1].
bool is_scalar(const TensorView& t) {
  return t.numel() == 1 && t.shape.size() <= 1;
}

struct Checker {
  const QuantizedWeight& w;

  std::string what() const {
    return fmt::format("the {} weight '{}' [{}, {}]", weight_format_name(w), w.name, w.rows, w.cols);
  }
  const TensorView& need(const TensorView* t, const char* suffix, const char* meaning) const {
    if (!t) {
      fail("{}: {} has no '{}' tensor ({}) next to '{}'", w.data ? w.data->file : std::string("checkpoint"), what(),
           suffix, meaning, w.data ? w.data->name : w.name);
    }
    return *t;
  }
  void tensor(const TensorView* t, const char* suffix, std::initializer_list<DType> dtypes,
              const std::vector<int64_t>& shape, const char* meaning) const {
    const TensorView& v = need(t, suffix, meaning);
    const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), v.dtype) != dtypes.end();
    if (!dtype_ok || v.shape != shape) {
      std::vector<std::string> names;
      for (DType d : dtypes) names.emplace_back(dtype_name(d));
      fail("{}: tensor '{}' is {} {}, expected {} {} ({}) for {}", v.file, v.name, dtype_name(v.dtype), v.shape_str(),
           fmt::join(names, " or "), shape_str(shape), meaning, what());
    }
  }
  void scalar(const TensorView* t, const char* suffix, std::initializer_list<DType> dtypes, const char* meaning) const {
    const TensorView& v = need(t, suffix, meaning);
    if (std::find(dtypes.begin(), dtypes.end(), v.dtype) == dtypes.end() || !is_scalar(v)) {
      fail("{}: tensor '{}' is {} {}, expected one {} value (shape [] or [1]: {}) for {}", v.file, v.name,
           dtype_name(v.dtype), v.shape_str(), dtype_name(*dtypes.begin()), meaning, what());
    }
  }
  void absent(const TensorView* t, const char* why) const {
    if (t) fail("{}: tensor '{}' does not belong to {}: {}", t->file, t->name, what(), why);
  }
};

constexpr std::initializer_list<DType> kScaleTypes = {DType::BF16, DType::F16, DType::F32};

}  // namespace

QuantConfig parse_quant_config(const json& config, const json& hf_quant, const std::string& source) {
  QuantConfig q;
  q.source = source;
  const json* qc = nullptr;
  if (auto it = config.find("quantization_config"); it != config.end() && !it->is_null()) qc = &*it;
  if (auto t = config.find("text_config"); !qc && t != config.end() && t->is_object()) {
    if (auto it = t->find("quantization_config"); it != t->end() && !it->is_null()) qc = &*it;
  }
  if (qc && !qc->is_object()) fail("{}: quantization_config must be an object, got {}", source, qc->dump());
  const json* hf = nullptr;
  if (!hf_quant.is_null()) {
    auto it = hf_quant.find("quantization");
    if (it == hf_quant.end() || !it->is_object()) {
      fail("{}: hf_quant_config.json has no 'quantization' object", source);
    }
    hf = &*it;
  }
  if (!qc && !hf) return q;
  const Fields c{qc ? *qc : json::object(), "config.json: quantization_config"};
  q.method = qc ? c.str("quant_method") : "modelopt";
  if (hf && q.method != "modelopt") {
    fail("{}: hf_quant_config.json (ModelOpt) is present but config.json quant_method is '{}'", source, q.method);
  }
  if (q.method == "modelopt") {
    parse_modelopt(qc, hf, source, q);
  } else if (q.method == "fp8") {
    parse_fp8(c, q);
  } else if (q.method == "compressed-tensors") {
    parse_compressed_tensors(c, q);
  } else if (q.method == "gptq") {
    parse_gptq(c, q);
  } else if (q.method == "auto-round") {
    parse_auto_round(c, q);
  } else if (q.method == "awq") {
    parse_awq(c, q);
  } else {
    fail(
        "{}: unknown quant_method '{}' in quantization_config (supported: modelopt, fp8, compressed-tensors, gptq, "
        "auto-round, awq)",
        source, q.method);
  }
  return q;
}

QuantConfig read_quant_config(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const fs::path cfg = fs::is_directory(dir) ? dir / "config.json" : dir;
  const fs::path hf = (fs::is_directory(dir) ? dir : dir.parent_path()) / "hf_quant_config.json";
  const json doc = read_json(cfg);
  const bool has_hf = fs::exists(hf);
  const json hf_doc = has_hf ? read_json(hf) : json();
  return parse_quant_config(doc, hf_doc, has_hf ? cfg.string() + " + " + hf.string() : cfg.string());
}

void validate_quantized_weight(const QuantizedWeight& w) {
  const Checker c{w};
  const int64_t N = w.rows, K = w.cols;
  FN_CHECK(N > 0 && K > 0, "quantized weight '{}': empty logical shape [{}, {}]", w.name, N, K);
  switch (w.format) {
    case QuantFormat::Nvfp4:
    case QuantFormat::CtNvfp4: {
      const bool mo = w.format == QuantFormat::Nvfp4;
      if (K % 16 != 0 || w.group != 16) {
        fail("{}: NVFP4 needs groups of 16 inputs dividing K (K = {}, group {})", c.what(), K, w.group);
      }
      c.tensor(w.data, mo ? "weight" : "weight_packed", {DType::U8}, {N, K / 2}, "two E2M1 codes per byte");
      c.tensor(w.scale, "weight_scale", {DType::F8_E4M3}, {N, K / 16}, "one E4M3 scale per 16 inputs");
      c.scalar(w.global_scale, mo ? "weight_scale_2" : "weight_global_scale", {DType::F32},
               mo ? "per-tensor multiplier" : "per-tensor divisor");
      c.absent(w.zero_point, "NVFP4 has no zero points");
      c.absent(w.g_idx, "NVFP4 has no g_idx");
      break;
    }
    case QuantFormat::Fp8Block: {
      if (w.block_rows <= 0 || w.block_cols <= 0) fail("{}: FP8 block size not set", c.what());
      c.tensor(w.data, "weight", {DType::F8_E4M3}, {N, K}, "E4M3 values");
      c.tensor(w.scale, "weight_scale_inv", kScaleTypes, {ceil_div(N, w.block_rows), ceil_div(K, w.block_cols)},
               "one multiplier per block");
      c.absent(w.global_scale, "FP8 block weights have no per-tensor scale");
      c.absent(w.zero_point, "FP8 has no zero points");
      break;
    }
    case QuantFormat::CtInt8:
    case QuantFormat::CtFp8: {
      const bool i8 = w.format == QuantFormat::CtInt8;
      c.tensor(w.data, "weight", {i8 ? DType::I8 : DType::F8_E4M3}, {N, K}, i8 ? "int8 values" : "E4M3 values");
      const TensorView& s = c.need(w.scale, "weight_scale", "one scale per output row, or one for the tensor");
      if (s.numel() == 1) {  // strategy tensor: [1], [1, 1] or a scalar
        c.tensor(w.scale, "weight_scale", kScaleTypes, s.shape, "one scale for the tensor");
      } else {
        c.tensor(w.scale, "weight_scale", kScaleTypes, {N, 1}, "one scale per output row");
      }
      c.absent(w.global_scale, "8-bit channel weights have no second scale");
      c.absent(w.zero_point, "only symmetric 8-bit weights are supported");
      break;
    }
    case QuantFormat::CtInt4: {
      const int64_t G = w.group ? ceil_div(K, w.group) : 1;
      if (w.group && K > w.group && K % w.group != 0) {
        fail("{}: group_size {} does not divide K = {}", c.what(), w.group, K);
      }
      c.tensor(w.data, "weight_packed", {DType::I32}, {N, ceil_div(K, 8)}, "eight 4-bit values per int32 along K");
      c.tensor(w.scale, "weight_scale", kScaleTypes, {N, G}, "one scale per group");
      if (w.zero_point) {
        c.tensor(w.zero_point, "weight_zero_point", {DType::I32}, {ceil_div(N, 8), G},
                 "zero points packed eight per int32 along the output dimension");
      }
      if (w.shape) {
        c.tensor(w.shape, "weight_shape", {DType::I64, DType::I32}, {2}, "the logical [out, in]");
        const int64_t s0 = w.shape->dtype == DType::I64 ? load<int64_t>(*w.shape, 0) : load<int32_t>(*w.shape, 0);
        const int64_t s1 = w.shape->dtype == DType::I64 ? load<int64_t>(*w.shape, 1) : load<int32_t>(*w.shape, 1);
        if (s0 != N || s1 != K) {
          fail("{}: tensor '{}' holds [{}, {}], but {} is [{}, {}]", w.shape->file, w.shape->name, s0, s1, w.name, N,
               K);
        }
      }
      c.absent(w.global_scale, "int4 weights have no global scale");
      break;
    }
    case QuantFormat::Gptq: {
      const int64_t G = w.group ? ceil_div(K, w.group) : 1, b = w.bits;
      if (!gptq_bits_ok(b)) fail("{}: {} bits: GPTQ packings of 2, 3, 4 or 8 bits are supported", c.what(), b);
      if ((K * b) % 32 != 0 || (N * b) % 32 != 0) {
        fail("{}: {}-bit GPTQ packing needs both dimensions times {} divisible by 32", c.what(), b, b);
      }
      const std::string packed_inputs = fmt::format("{}-bit values packed along the input dimension", b),
                        packed_zeros = fmt::format("{}-bit zero points packed along the outputs", b);
      c.tensor(w.data, "qweight", {DType::I32}, {K * b / 32, N}, packed_inputs.c_str());
      c.tensor(w.scale, "scales", kScaleTypes, {G, N}, "one scale per group and output");
      c.tensor(w.zero_point, "qzeros", {DType::I32}, {G, N * b / 32}, packed_zeros.c_str());
      if (w.g_idx) {
        c.tensor(w.g_idx, "g_idx", {DType::I32}, {K}, "group of each input");
        for (int64_t k = 0; k < K; ++k) {
          const int32_t g = load<int32_t>(*w.g_idx, size_t(k));
          const int64_t want = w.group ? k / w.group : 0;
          if (g != want) {
            fail(
                "{}: tensor '{}' maps input {} to group {}, expected {} (input / group_size {}): GPTQ act-order "
                "(desc_act) permutations are not supported",
                w.g_idx->file, w.g_idx->name, k, g, want, w.group);
          }
        }
      }
      c.absent(w.global_scale, "GPTQ has no global scale");
      break;
    }
    case QuantFormat::Awq: {
      const int64_t g = w.group ? w.group : K;
      if (K % g != 0) {
        fail("{}: tensor '{}': group_size {} does not divide K = {} (AWQ groups must tile the input dimension)",
             w.data ? w.data->file : std::string("checkpoint"), w.data ? w.data->name : w.name, g, K);
      }
      if (N % 8 != 0) fail("{}: AWQ packs eight outputs per int32, so N = {} must be a multiple of 8", c.what(), N);
      const int64_t G = K / g;
      c.tensor(w.data, "qweight", {DType::I32}, {K, N / 8}, "eight 4-bit outputs per int32 in AWQ order");
      c.tensor(w.scale, "scales", kScaleTypes, {G, N}, "one scale per group and output");
      if (w.zero_point) {
        c.tensor(w.zero_point, "qzeros", {DType::I32}, {G, N / 8},
                 "zero points packed eight per int32 along outputs in AWQ order");
      }
      c.absent(w.global_scale, "AWQ has no global scale");
      c.absent(w.g_idx, "AWQ has no g_idx");
      c.absent(w.shape, "AWQ has no weight_shape");
      break;
    }
    case QuantFormat::None:
      fail("quantized weight '{}': no format", w.name);
  }
}

std::vector<float> dequantize(const QuantizedWeight& w) {
  validate_quantized_weight(w);
  const int64_t N = w.rows, K = w.cols;
  std::vector<float> out(size_t(N * K));
  const std::vector<float> scale = to_float(*w.scale);
  switch (w.format) {
    case QuantFormat::Nvfp4:
    case QuantFormat::CtNvfp4: {
      const float global = load<float>(*w.global_scale, 0);
      const uint8_t* codes = w.data->data;
      const uint8_t* scales = w.scale->data;
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t byte = codes[n * (K / 2) + k / 2];
          const uint8_t code = (k & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xf);  // even element: low nibble
          const float v = e2m1_to_float(code) * f8e4m3_to_float(scales[n * (K / 16) + k / 16]);  // exact
          out[size_t(n * K + k)] = w.format == QuantFormat::Nvfp4 ? v * global : v / global;
        }
      }
      break;
    }
    case QuantFormat::Fp8Block: {
      const int64_t SK = ceil_div(K, w.block_cols);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          out[size_t(n * K + k)] =
              f8e4m3_to_float(w.data->data[n * K + k]) * scale[size_t((n / w.block_rows) * SK + k / w.block_cols)];
        }
      }
      break;
    }
    case QuantFormat::CtInt8:
    case QuantFormat::CtFp8: {  // float(q) * the row's (or the tensor's) scale: one multiply
      const bool per_row = scale.size() != 1;
      for (int64_t n = 0; n < N; ++n) {
        const float s = scale[size_t(per_row ? n : 0)];
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t b = w.data->data[n * K + k];
          const float q = w.format == QuantFormat::CtInt8 ? float(int8_t(b)) : f8e4m3_to_float(b);
          out[size_t(n * K + k)] = q * s;
        }
      }
      break;
    }
    case QuantFormat::CtInt4: {
      const int64_t G = w.group ? ceil_div(K, w.group) : 1, KP = ceil_div(K, 8);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const int64_t g = w.group ? k / w.group : 0;
          const uint32_t word = uint32_t(load<int32_t>(*w.data, size_t(n * KP + k / 8)));
          int32_t q = int32_t((word >> (4 * (k % 8))) & 0xfu) - 8;
          if (w.zero_point) {
            const uint32_t zw = uint32_t(load<int32_t>(*w.zero_point, size_t((n / 8) * G + g)));
            q -= int32_t((zw >> (4 * (n % 8))) & 0xfu) - 8;
          }
          out[size_t(n * K + k)] = float(q) * scale[size_t(n * G + g)];
        }
      }
      break;
    }
    case QuantFormat::Gptq: {
      const int b = int(w.bits);
      const int64_t NZ = N * b / 32;
      const int32_t zero_offset = w.gptq_v2 ? 0 : 1;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = w.group ? k / w.group : 0;
        for (int64_t n = 0; n < N; ++n) {  // core/quant_format.h: qweight column n, qzeros row g
          const int32_t q =
              int32_t(gptq_packed_value([&](int64_t j) { return load<int32_t>(*w.data, size_t(j * N + n)); }, b, k));
          const int32_t z = int32_t(gptq_packed_value(
                                [&](int64_t j) { return load<int32_t>(*w.zero_point, size_t(g * NZ + j)); }, b, n)) +
                            zero_offset;
          out[size_t(n * K + k)] = float(q - z) * scale[size_t(g * N + n)];
        }
      }
      break;
    }
    case QuantFormat::Awq: {
      // Output 8j + m sits in nibble kAwqNibble[m] of word j (core/quant_format.h).
      const int64_t g = w.group ? w.group : K, NW = N / 8;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t gi = k / g;
        for (int64_t n = 0; n < N; ++n) {
          const int shift = 4 * kAwqNibble[n % 8];
          const uint32_t word = uint32_t(load<int32_t>(*w.data, size_t(k * NW + n / 8)));
          const int32_t q = int32_t((word >> shift) & 0xfu);
          int32_t z = 8;  // zero_point false: symmetric
          if (w.zero_point)
            z = int32_t((uint32_t(load<int32_t>(*w.zero_point, size_t(gi * NW + n / 8))) >> shift) & 0xfu);
          out[size_t(n * K + k)] = float(q - z) * scale[size_t(gi * N + n)];  // exact for F16 / BF16 scales
        }
      }
      break;
    }
    case QuantFormat::None:
      break;
  }
  return out;
}

std::vector<float> w8_linear_scales(const QuantizedWeight& w, int64_t* group) {
  FN_CHECK(w8_linear_holds(w.format), "quantized weight '{}': {} is not held as 8-bit codes with scales", w.name,
           quant_format_name(w.format));
  validate_quantized_weight(w);
  const int64_t N = w.rows, K = w.cols;
  const std::vector<float> scale = to_float(*w.scale);
  if (w.format == QuantFormat::Fp8Block) {
    const int64_t SK = ceil_div(K, w.block_cols);
    std::vector<float> out(size_t(N * SK));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < SK; ++j) out[size_t(n * SK + j)] = scale[size_t((n / w.block_rows) * SK + j)];
    *group = w8_linear_group(w);
    return out;
  }
  const bool per_row = scale.size() != 1;
  std::vector<float> out(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) out[size_t(n)] = scale[size_t(per_row ? n : 0)];
  *group = w8_linear_group(w);
  return out;
}

bool w8_linear_weight_name(std::string_view name) {
  static constexpr std::string_view kSuffixes[] = {".linear_attn.in_proj_qkv.weight", ".linear_attn.in_proj_z.weight",
                                                   ".linear_attn.in_proj_b.weight",   ".linear_attn.in_proj_a.weight",
                                                   ".linear_attn.out_proj.weight",    ".self_attn.q_proj.weight",
                                                   ".self_attn.k_proj.weight",        ".self_attn.v_proj.weight",
                                                   ".self_attn.o_proj.weight",        ".indexer.index_qk_proj.weight",
                                                   ".shared_expert.gate_proj.weight", ".shared_expert.up_proj.weight",
                                                   ".shared_expert.down_proj.weight", ".ple.key_proj.weight",
                                                   ".ple.value_proj.weight"};
  if (name.starts_with("mtp.")) return false;
  for (std::string_view s : kSuffixes)
    if (name.ends_with(s)) return true;
  return false;
}

float ple_table_scale(const TensorView& shard, const TensorView& weight_scale) {
  if (shard.dtype != DType::F8_E4M3 && shard.dtype != DType::F8_E5M2) {
    fail("{}: PLE table shard '{}' is {}, expected FP8 to go with '{}'", shard.file, shard.name,
         dtype_name(shard.dtype), weight_scale.name);
  }
  if (!is_float(weight_scale.dtype) || !is_scalar(weight_scale)) {
    fail("{}: tensor '{}' is {} {}, expected one BF16 value (shape [1]): the FP8 PLE table's multiplier",
         weight_scale.file, weight_scale.name, dtype_name(weight_scale.dtype), weight_scale.shape_str());
  }
  const float s = to_float(weight_scale)[0];
  if (!std::isfinite(s)) {
    fail("{}: tensor '{}' (the FP8 PLE table's multiplier) is {}, expected a finite value", weight_scale.file,
         weight_scale.name, s);
  }
  return s;
}

int64_t w4a16_packed_bytes(int64_t rows, int64_t cols, int64_t group, bool zeros) {
  const int64_t wpr = 4 * ceil_div(cols, 32), g = group > 0 ? group : cols;
  const int64_t groups = g > 0 ? ceil_div(8 * wpr, g) : 0;
  return rows * (wpr * 4 + groups * (2 + (zeros ? 1 : 0)) + 4);
}

int64_t w4a16_planes_packed_bytes(int64_t rows, int64_t cols, int64_t group) {
  return w4a16_packed_bytes(rows, 2 * cols, group > 0 && group < cols ? group : cols, true);
}

int64_t w8a16_fp8_packed_bytes(int64_t rows, int64_t cols, int64_t group) {
  const int64_t wpr = 4 * ceil_div(cols, 16), g = group > 0 ? group : cols;
  const int64_t groups = g > 0 ? ceil_div(4 * wpr, g) : 0;
  return rows * (wpr * 4 + groups * 4 + 4);
}

int64_t ple_int8_group(const TensorView& shard, const TensorView& scales, bool check_values) {
  if (shard.dtype != DType::I8) {
    fail("{}: PLE table shard '{}' is {}, expected I8 to go with the group scales '{}'", shard.file, shard.name,
         dtype_name(shard.dtype), scales.name);
  }
  if (shard.shape.size() != 2 || scales.shape.size() != 2 || !is_float(scales.dtype) ||
      scales.shape[0] != shard.shape[0] || scales.shape[1] < 1 || shard.shape[1] % scales.shape[1] != 0) {
    fail(
        "{}: tensor '{}' is {} {}, expected BF16, F16 or F32 [{}, {} / g] (one scale per row and group of g "
        "columns of the I8 shard '{}' {}, g dividing {})",
        scales.file, scales.name, dtype_name(scales.dtype), scales.shape_str(),
        shard.shape.empty() ? 0 : shard.shape[0], shard.shape.size() == 2 ? shard.shape[1] : 0, shard.name,
        shard.shape_str(), shard.shape.size() == 2 ? shard.shape[1] : 0);
  }
  if (check_values) {
    const std::vector<float> s = to_float(scales);
    for (size_t i = 0; i < s.size(); ++i) {
      if (!std::isfinite(s[i])) {
        fail("{}: tensor '{}' element {} is {}, expected finite group scales", scales.file, scales.name, i, s[i]);
      }
    }
  }
  return shard.shape[1] / scales.shape[1];
}

std::vector<float> dequantize_ple_shard_int8(const TensorView& shard, const TensorView& scales) {
  const int64_t g = ple_int8_group(shard, scales);
  const std::vector<float> s = to_float(scales);
  std::vector<float> out(size_t(shard.numel()));
  convert_to_float(shard.dtype, shard.data, out.data(), out.size());
  const int64_t cols = shard.shape[1], groups = scales.shape[1];
  for (int64_t r = 0; r < shard.shape[0]; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(r * cols + c)] *= s[size_t(r * groups + c / g)];  // exact for 16-bit scales (quant.h)
  return out;
}

std::string weight_format_name(const QuantizedWeight& w) {
  if (w.format == QuantFormat::Gptq) return fmt::format("int{}-gptq", w.bits);
  if ((w.format == QuantFormat::CtInt8 || w.format == QuantFormat::CtFp8) && w.scale) {
    return fmt::format("{}-{}", w.format == QuantFormat::CtInt8 ? "int8" : "fp8",
                       w.scale->numel() == 1 ? "tensor" : "channel");
  }
  return quant_format_name(w.format);
}

std::vector<float> dequantize_ple_shard(const TensorView& shard, const TensorView& weight_scale) {
  const float s = ple_table_scale(shard, weight_scale);
  std::vector<float> out(size_t(shard.numel()));
  convert_to_float(shard.dtype, shard.data, out.data(), out.size());
  for (float& v : out) v *= s;  // exact: 4-bit by 8-bit significands
  return out;
}

// ---------------------------------------------------------------- scheme

namespace {

// Module-name pattern checks of the configs: GPTQModel `dynamic` and compressed-tensors "re:" targets use Python's
// re.match (anchored at the start only).
bool re_match(const std::string& pattern, const std::string& s) {
  return std::regex_search(s, std::regex(pattern), std::regex_constants::match_continuous);
}

// The compressed-tensors config groups that target `module`.
std::vector<const CtGroup*> ct_groups_for(const QuantConfig& q, const std::string& module) {
  std::vector<const CtGroup*> out;
  for (const CtGroup& g : q.ct_groups) {
    for (const std::string& t : g.targets) {
      const bool hit = t.rfind("re:", 0) == 0 ? re_match(t.substr(3), module) : (t == "Linear" || t == module);
      if (hit) {
        out.push_back(&g);
        break;
      }
    }
  }
  return out;
}

// The per-format companion suffixes (a weight may carry only these).
std::set<std::string> allowed_suffixes(QuantFormat f) {
  switch (f) {
    case QuantFormat::Nvfp4:
      return {"weight", "weight_scale", "weight_scale_2", "input_scale"};
    case QuantFormat::CtNvfp4:
      return {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale", "weight_shape"};
    case QuantFormat::Fp8Block:
      return {"weight", "weight_scale_inv"};
    case QuantFormat::CtInt4:
      return {"weight_packed", "weight_scale", "weight_zero_point", "weight_shape"};
    case QuantFormat::Gptq:
      return {"qweight", "qzeros", "scales", "g_idx"};
    case QuantFormat::Awq:
      return {"qweight", "qzeros", "scales"};
    case QuantFormat::CtInt8:
    case QuantFormat::CtFp8:
      return {"weight", "weight_scale", "input_scale"};
    case QuantFormat::None:
      return {"weight"};
  }
  return {};
}

}  // namespace

QuantScheme QuantScheme::build(const QuantConfig& cfg, const ModelConfig& model, const WeightManifest& m) {
  QuantScheme s;
  std::map<std::string, const ExpectedTensor*> expected;
  const std::vector<ExpectedTensor> plan = expected_tensors(model);
  for (const ExpectedTensor& e : plan) expected.emplace(e.name, &e);

  // Stems of weights stored quantized: a companion, or a non-float `.weight`.
  std::set<std::string> stems;
  for (const auto& [name, e] : m.entries()) {
    if (e.component == Component::PleTable) {
      if (e.view.dtype == DType::F8_E4M3 || e.view.dtype == DType::F8_E5M2) ++s.summary_["ple_table"]["fp8-scalar"];
      if (e.view.dtype == DType::I8) {
        const ManifestEntry* sc = m.find(name + "_scale");  // shard_K.weight -> shard_K.weight_scale
        if (sc) ++s.summary_["ple_table"][fmt::format("int8-g{}", ple_int8_group(e.view, sc->view))];
      }
      continue;
    }
    if (e.component == Component::PleHashBuffers) continue;
    const std::string suffix = quant_companion_suffix(name);
    if (!suffix.empty()) {
      stems.insert(name.substr(0, name.size() - suffix.size() - 1));
    } else if (name.ends_with(".weight") && !is_float(e.view.dtype)) {
      stems.insert(name.substr(0, name.size() - 7));
    }
  }

  // AutoRound's regex extra_config keys, compiled once (checked when the config was parsed).
  std::vector<std::pair<const std::string*, std::regex>> auto_round_patterns;
  for (const auto& [key, layer] : cfg.auto_round_layers)
    if (is_regex_key(key)) auto_round_patterns.emplace_back(&key, std::regex(key));

  for (const std::string& stem : stems) {
    // Every tensor stored under this stem: the weight and its companions.
    std::map<std::string, const ManifestEntry*> parts;
    for (auto it = m.entries().lower_bound(stem + "."); it != m.entries().end(); ++it) {
      const std::string& n = it->first;
      if (n.compare(0, stem.size() + 1, stem + ".") != 0) break;
      const std::string rest = n.substr(stem.size() + 1);
      if (rest.find('.') == std::string::npos && (rest == "weight" || !quant_companion_suffix(n).empty())) {
        parts.emplace(rest, &it->second);
      }
    }
    auto view = [&](const char* suffix) -> const TensorView* {
      auto it = parts.find(suffix);
      return it == parts.end() ? nullptr : &it->second->view;
    };
    const TensorView* weight = view("weight");
    const ManifestEntry* first = parts.begin()->second;
    const std::string& file = first->view.file;

    QuantizedWeight q;
    q.name = stem + ".weight";
    if (view("qweight")) {  // GPTQ [K/8, N] or AutoAWQ GEMM [K, N/8]: the config says which
      q.format = cfg.method == "awq" || cfg.auto_round_awq ? QuantFormat::Awq : QuantFormat::Gptq;
    } else if (const TensorView* p = view("weight_packed")) {
      if (p->dtype == DType::I32) {
        q.format = QuantFormat::CtInt4;
      } else if (p->dtype == DType::U8) {
        q.format = QuantFormat::CtNvfp4;
      } else {
        fail("{}: tensor '{}' is {}: weight_packed must be I32 (int4 pack-quantized) or U8 (nvfp4-pack-quantized)",
             p->file, p->name, dtype_name(p->dtype));
      }
    } else if (weight && weight->dtype == DType::U8) {
      q.format = QuantFormat::Nvfp4;
    } else if (weight && weight->dtype == DType::F8_E4M3 && view("weight_scale_inv")) {
      q.format = QuantFormat::Fp8Block;
    } else if (weight && weight->dtype == DType::F8_E4M3 && view("weight_scale") &&
               cfg.method == "compressed-tensors") {
      q.format = QuantFormat::CtFp8;
    } else if (weight && weight->dtype == DType::I8 && view("weight_scale")) {
      q.format = QuantFormat::CtInt8;
    } else if (weight && (weight->dtype == DType::F8_E4M3 || weight->dtype == DType::F8_E5M2)) {
      fail(
          "{}: tensor '{}' is {} without a block 'weight_scale_inv': per-tensor or per-channel FP8 weights are "
          "supported only as compressed-tensors float-quantized (E4M3 with a 'weight_scale'), FP8 blocks under "
          "quant_method fp8",
          weight->file, weight->name, dtype_name(weight->dtype));
    } else if (weight && is_float(weight->dtype)) {
      std::vector<std::string> extra;
      for (const auto& [suffix, e] : parts) {
        if (suffix != "weight") extra.push_back(e->source);
      }
      fail("{}: tensor '{}' is {} (not quantized) but has quantization tensors {}: they belong to no known format",
           weight->file, weight->name, dtype_name(weight->dtype), fmt::join(extra, ", "));
    } else {
      std::vector<std::string> have;
      for (const auto& [suffix, e] : parts) have.push_back(e->source);
      fail(
          "{}: the weight '{}' is stored as {} — no supported quantization format (modelopt NVFP4, FP8 block, "
          "compressed-tensors int4/NVFP4/int8/FP8, GPTQ or AutoRound of 2-8 bits, AutoAWQ int4) stores it that way",
          file, q.name, fmt::join(have, ", "));
    }
    // Companions of another format on the same weight.
    const std::set<std::string> allowed = allowed_suffixes(q.format);
    for (const auto& [suffix, e] : parts) {
      if (!allowed.count(suffix)) {
        fail(
            "{}: tensor '{}' does not belong to the {} format of '{}' (which uses {}): the checkpoint mixes "
            "quantization formats on one weight",
            e->view.file, e->source, quant_format_name(q.format), q.name, fmt::join(allowed, ", "));
      }
    }
    auto ex = expected.find(q.name);
    if (ex == expected.end() || ex->second->shape.size() != 2) {
      fail("{}: '{}' is stored quantized, but the config implies no 2-D weight of that name", file, q.name);
    }
    q.rows = ex->second->shape[0];
    q.cols = ex->second->shape[1];

    // The format must be the one the config declares for the module; its parameters come from the config.
    const std::string& source = first->source;
    const std::string module = source.substr(0, source.rfind('.'));
    const std::string fmt_name = quant_format_name(q.format);
    if (cfg.method.empty()) {
      fail("{}: '{}' is stored as {} but {} declares no quantization_config", file, source, fmt_name,
           cfg.source.empty() ? "the model" : cfg.source);
    }
    auto mismatch = [&](const std::string& declared) {
      fail(
          "{}: '{}' is stored as {}, but {} declares {} for module '{}': the checkpoint mixes formats the config "
          "does not describe",
          file, source, fmt_name, cfg.source, declared, module);
    };
    if (cfg.method == "modelopt") {
      std::string algo = cfg.algo;
      if (cfg.algo == "MIXED_PRECISION") {
        size_t best = 0;
        algo.clear();
        for (const auto& [prefix, a] : cfg.quantized_layers) {
          const bool hit = module == prefix || module.rfind(prefix + ".", 0) == 0;
          if (hit && prefix.size() >= best) {
            best = prefix.size();
            algo = a;
          }
        }
        if (algo.empty()) mismatch("no quantized_layers entry");
      }
      if (algo == "NVFP4" && q.format == QuantFormat::Nvfp4) {
        q.group = 16;
      } else if (algo == "FP8_PB_WO" && q.format == QuantFormat::Fp8Block) {
        q.block_rows = q.block_cols = 128;
      } else {
        mismatch("modelopt " + algo);
      }
    } else if (cfg.method == "fp8") {
      if (q.format != QuantFormat::Fp8Block) mismatch("quant_method fp8 (block FP8)");
      q.block_rows = cfg.block_rows;
      q.block_cols = cfg.block_cols;
    } else if (cfg.method == "compressed-tensors") {
      const std::vector<const CtGroup*> groups = ct_groups_for(cfg, module);
      if (groups.empty()) mismatch("no config group targeting it");
      const CtGroup& g = *groups[0];
      for (const CtGroup* o : groups) {
        if (o->format != g.format || o->group_size != g.group_size || o->symmetric != g.symmetric) {
          fail("{}: module '{}' is targeted by config groups '{}' and '{}' with different weight arguments", cfg.source,
               module, g.name, o->name);
        }
      }
      const QuantFormat want = g.format == "pack-quantized"    ? QuantFormat::CtInt4
                               : g.format == "int-quantized"   ? QuantFormat::CtInt8
                               : g.format == "float-quantized" ? QuantFormat::CtFp8
                                                               : QuantFormat::CtNvfp4;
      if (q.format != want) mismatch(fmt::format("config group '{}' ({})", g.name, g.format));
      q.group = g.group_size;
      if (q.format == QuantFormat::CtInt4) {
        q.zero_point = view("weight_zero_point");
        if (!g.symmetric && !q.zero_point) {
          fail("{}: '{}' has no '{}.weight_zero_point', but config group '{}' is asymmetric (symmetric false)", file,
               source, module, g.name);
        }
        if (g.symmetric && q.zero_point) {
          fail("{}: '{}' has zero points '{}', but config group '{}' is symmetric", q.zero_point->file, source,
               q.zero_point->name, g.name);
        }
      }
    } else if (cfg.method == "auto-round") {
      if (cfg.auto_round_awq) {
        if (q.format != QuantFormat::Awq) mismatch("quant_method auto-round (AutoAWQ GEMM packing)");
      } else if (q.format != QuantFormat::Gptq) {
        mismatch("quant_method auto-round (GPTQ packing)");
      }
      q.bits = cfg.bits;
      q.group = cfg.group_size;
      bool sym = cfg.auto_round_sym;
      // AutoRound's own reading (auto_round/inference/utils.py _expand_regex_config): an entry named exactly for the
      // module wins; else the first regex key (one with a regex metacharacter; re.search) that matches it.
      const AutoRoundLayer* layer = nullptr;
      const std::string* key = nullptr;
      if (auto it = cfg.auto_round_layers.find(module); it != cfg.auto_round_layers.end()) {
        layer = &it->second;
        key = &it->first;
      } else {
        for (const auto& [k, re] : auto_round_patterns) {
          if (std::regex_search(module, re)) {
            layer = &cfg.auto_round_layers.at(*k);
            key = k;
            break;
          }
        }
      }
      if (layer) {
        if (layer->bits >= 16) {
          mismatch(fmt::format("{} bits (not quantized) in extra_config entry '{}'", layer->bits, *key));
        }
        q.bits = layer->bits;
        q.group = layer->group_size;
        sym = layer->sym;
      }
      if (cfg.auto_round_awq) {
        // AutoAWQ's GEMM modules carry qzeros whether or not the rounding was symmetric (zero 8 then): they are read
        // when present; an asymmetric module must have them.
        q.zero_point = view("qzeros");
        if (!sym && !q.zero_point) {
          fail("{}: '{}' has no '{}.qzeros', but {} declares it asymmetric (AutoRound sym false)", file, source, module,
               cfg.source);
        }
      }
    } else if (cfg.method == "gptq") {
      q.bits = cfg.bits;
      q.group = cfg.group_size;
      for (const GptqRule& r : cfg.gptq_dynamic) {
        if (r.exclude && re_match(r.pattern, module)) {
          mismatch(fmt::format("no quantization (dynamic rule '-:{}')", r.pattern));
        }
      }
      for (const GptqRule& r : cfg.gptq_dynamic) {
        if (r.exclude || !re_match(r.pattern, module)) continue;
        if (r.bits) q.bits = r.bits;
        if (r.group_size) q.group = r.group_size < 0 ? 0 : r.group_size;
        break;
      }
      q.gptq_v2 = cfg.gptq_v2;
    } else if (cfg.method == "awq") {
      if (q.format != QuantFormat::Awq) mismatch("quant_method awq (AutoAWQ GEMM qweight / qzeros / scales)");
      for (const std::string& skip : cfg.not_convert) {  // transformers / vLLM: a substring of the module name
        if (!skip.empty() && module.find(skip) != std::string::npos) {
          mismatch(fmt::format("no quantization (modules_to_not_convert '{}')", skip));
        }
      }
      q.group = cfg.group_size;
      q.zero_point = view("qzeros");
      if (cfg.awq_zero_point && !q.zero_point) {
        fail("{}: '{}' has no '{}.qzeros', but {} declares AWQ zero_point true (one zero point per group)", file,
             source, module, cfg.source);
      }
      if (!cfg.awq_zero_point && q.zero_point) {
        fail("{}: '{}' has zero points '{}', but {} declares AWQ zero_point false (symmetric, zero 8)",
             q.zero_point->file, source, q.zero_point->name, cfg.source);
      }
    }

    switch (q.format) {
      case QuantFormat::Nvfp4:
        q.data = weight;
        q.scale = view("weight_scale");
        q.global_scale = view("weight_scale_2");
        if (const TensorView* in = view("input_scale"); in && (in->dtype != DType::F32 || !is_scalar(*in))) {
          fail("{}: tensor '{}' is {} {}, expected one F32 value (the activation scale)", in->file, in->name,
               dtype_name(in->dtype), in->shape_str());
        }
        break;
      case QuantFormat::CtNvfp4:
        q.data = view("weight_packed");
        q.scale = view("weight_scale");
        q.global_scale = view("weight_global_scale");
        q.shape = view("weight_shape");
        break;
      case QuantFormat::Fp8Block:
        q.data = weight;
        q.scale = view("weight_scale_inv");
        break;
      case QuantFormat::CtInt4:
        q.data = view("weight_packed");
        q.scale = view("weight_scale");
        q.shape = view("weight_shape");
        break;
      case QuantFormat::Gptq:
        q.data = view("qweight");
        q.scale = view("scales");
        q.zero_point = view("qzeros");
        q.g_idx = view("g_idx");
        break;
      case QuantFormat::Awq:  // zero_point: above, with the config's zero_point
        q.data = view("qweight");
        q.scale = view("scales");
        break;
      case QuantFormat::CtInt8:
      case QuantFormat::CtFp8:
        q.data = weight;
        q.scale = view("weight_scale");
        if (const TensorView* in = view("input_scale"); in && !is_float(in->dtype)) {
          fail("{}: tensor '{}' is {}, expected a float activation scale", in->file, in->name, dtype_name(in->dtype));
        }
        break;
      case QuantFormat::None:
        break;
    }
    validate_quantized_weight(q);
    ++s.summary_[component_name(first->component)][weight_format_name(q)];
    s.weights_.emplace(q.name, std::move(q));
  }
  return s;
}

const QuantizedWeight* QuantScheme::find(const std::string& name) const {
  auto it = weights_.find(name);
  return it == weights_.end() ? nullptr : &it->second;
}

}  // namespace flashnext
