#include "server/server.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <map>
#include <random>

#include "engine/output.h"
#include "server/http_server.h"
#include "server/ids.h"
#include "server/metrics.h"
#include "server/openai_schema.h"
#include "server/output_parsers.h"
#include "server/responses_api.h"
#include "server/sse.h"
#include "server/structured_output.h"

namespace flashnext::server {

namespace {

using Ms = std::chrono::milliseconds;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Seconds a client should wait before retrying a 503 (the waiting queue was full).
constexpr int kRetryAfterSeconds = 1;
// A request whose body is at least this large returns the heap it freed to the system when it ends.
constexpr size_t kTrimAfterBytes = size_t(1) << 20;

// A JSON response; `close`: the connection is closed after it.
HttpResponse json_response(int status, const json& body, bool close = false) {
  HttpResponse res;
  res.status = status;
  res.headers.emplace_back("Content-Type", "application/json");
  if (status == 503) res.headers.emplace_back("Retry-After", std::to_string(kRetryAfterSeconds));
  res.body = dump_json(body);
  res.close = close;
  return res;
}

// A header's value, nullopt when it is absent.
std::optional<std::string> header_of(const HttpRequest& req, std::string_view name) {
  if (!req.has_header(name)) return std::nullopt;
  return req.header(name);
}

bool has_header(const HttpResponse& res, std::string_view name) {
  for (const auto& [k, v] : res.headers) {
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        }))
      return true;
  }
  return false;
}

// The most bytes one token can stand for: the longest vocabulary entry or added-token text.
size_t max_token_bytes(const Tokenizer& tokenizer) {
  size_t most = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) most = std::max(most, tokenizer.token_bytes(id).size());
  for (const AddedToken& t : tokenizer.added_tokens()) most = std::max(most, t.content.size());
  return most;
}

// Prometheus buckets (seconds), those of vLLM extended down to the millisecond the CPU backend reaches.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                         0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0};
const std::vector<double> kE2eBuckets = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,  5.0,
                                         10.0, 15.0,  20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};

// Token-count buckets 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's build_1_2_5_buckets(max_model_len)).
std::vector<double> buckets_1_2_5(int64_t max) {
  std::vector<double> out;
  for (double scale = 1;; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > double(std::max<int64_t>(max, 1))) return out;
      out.push_back(m * scale);
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------

struct Server::Impl {
  Impl(Scheduler& s, const Tokenizer& t, const chat::ChatTemplate* c, const GenerationConfig& g, ServerOptions o)
      : scheduler(s), tokenizer(t), chat_template(c), generation(g), options(std::move(o)) {
    const int64_t max_len = scheduler.config().max_model_len;
    if (options.max_request_bytes == 0) options.max_request_bytes = default_max_request_bytes(max_len);
    options.json_limits.max_elements =
        std::max(options.json_limits.max_elements, 2 * size_t(std::max<int64_t>(max_len, 0)) + 4096);
    // Normalization (NFC) can shrink text, by at most 3x (Hangul jamo); 4x leaves room.
    max_prompt_bytes = size_t(std::max<int64_t>(max_len, 0)) * max_token_bytes(tokenizer) * 4;
    add_vllm_metrics();
  }

  Scheduler& scheduler;
  const Tokenizer& tokenizer;
  const chat::ChatTemplate* chat_template;
  const GenerationConfig& generation;
  ServerOptions options;
  std::unique_ptr<HttpServer> http;  ///< made by install_routes
  /// The routes: path -> handler, for GET (HEAD too) and POST.
  using Route = std::function<HttpResponse(HttpRequest&)>;
  std::map<std::string, Route, std::less<>> get_routes, post_routes;
  /// When a refused connection (over --max-connections) was last logged: at most one line a second.
  std::atomic<int64_t> last_cap_log_ms{0};
  int64_t created = unix_now();
  std::atomic<uint64_t> next_id{0};
  /// A prompt text longer than this cannot fit max_model_len tokens (each token stands for at most
  /// max_token_bytes bytes, after normalization): rejected before it is tokenized.
  size_t max_prompt_bytes = 0;

  StructuredOutput structured{tokenizer, generation.eos_token_ids, scheduler.vocab_size(),
                              tool_call_format_of(chat_template)};

  MetricsRegistry metrics;
  Counter& m_requests =
      metrics.counter("flashnext_requests_total", "Generation requests finished, by endpoint and finish reason.");
  Counter& m_errors = metrics.counter("flashnext_request_errors_total", "Requests answered with an error, by status.");
  Counter& m_prompt_tokens = metrics.counter("flashnext_prompt_tokens_total", "Prompt tokens of admitted requests.");
  Counter& m_generation_tokens = metrics.counter("flashnext_generation_tokens_total", "Tokens generated.");
  Histogram& m_ttft = metrics.histogram("flashnext_time_to_first_token_seconds",
                                        "Time from request arrival to its first generated token.", kTtftBuckets);
  Histogram& m_itl = metrics.histogram("flashnext_inter_token_latency_seconds",
                                       "Time between two consecutive generated tokens of a request.", kItlBuckets);
  Histogram& m_e2e = metrics.histogram("flashnext_e2e_request_latency_seconds",
                                       "Time from request arrival to its last token.", kE2eBuckets);
  Gauge& m_running = metrics.gauge("flashnext_num_requests_running", "Requests in the running batch.");
  Gauge& m_waiting =
      metrics.gauge("flashnext_num_requests_waiting", "Requests waiting for admission (incl. preempted).");
  Gauge& m_kv_usage = metrics.gauge("flashnext_kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).");
  Gauge& m_kv_blocks = metrics.gauge("flashnext_kv_cache_blocks", "KV cache blocks, by state (used, total).");
  Gauge& m_slots = metrics.gauge("flashnext_state_slots", "GDN/PLE sequence state slots, by state (used, total).");
  Gauge& m_preemptions =
      metrics.gauge("flashnext_num_preemptions_total", "Sequences preempted so far.", MetricType::Counter);
  Gauge& m_ple_rows =
      metrics.gauge("flashnext_ple_rows_fetched_total", "PLE table rows gathered so far.", MetricType::Counter);
  Gauge& m_steps = metrics.gauge("flashnext_engine_steps_total", "Engine steps run so far.", MetricType::Counter);
  Gauge& m_prefix_queries =
      metrics.gauge("flashnext_prefix_cache_queries_total",
                    "Prompt tokens looked up in the prefix cache at admission so far.", MetricType::Counter);
  Gauge& m_prefix_hits =
      metrics.gauge("flashnext_prefix_cache_hits_total",
                    "Of the prompt tokens looked up, those found in the prefix cache.", MetricType::Counter);
  Gauge& m_prefix_blocks =
      metrics.gauge("flashnext_prefix_cache_blocks", "KV blocks registered in the prefix cache (held or evictable).");
  Gauge& m_prefix_snapshots =
      metrics.gauge("flashnext_prefix_cache_snapshots", "GDN/PLE state snapshots held by the prefix cache.");
  // Speculative decoding (serve --speculative): totals since start; vLLM's spec_decode names (vllm/v1/spec_decode).
  Gauge& m_spec_drafts = metrics.gauge("flashnext_spec_decode_num_drafts_total",
                                       "Speculative verify steps: items of one sequence's drafts verified in a step.",
                                       MetricType::Counter);
  Gauge& m_spec_draft_tokens = metrics.gauge("flashnext_spec_decode_num_draft_tokens_total",
                                             "Draft tokens proposed for verification.", MetricType::Counter);
  Gauge& m_spec_accepted = metrics.gauge("flashnext_spec_decode_num_accepted_tokens_total",
                                         "Draft tokens accepted by verification.", MetricType::Counter);
  Gauge& m_spec_emitted = metrics.gauge(
      "flashnext_spec_decode_num_emitted_tokens_total",
      "Tokens emitted by verify steps (accepted drafts plus one per step, less what a stop condition cut).",
      MetricType::Counter);
  Gauge& m_spec_rollbacks =
      metrics.gauge("flashnext_spec_decode_num_rollbacks_total",
                    "Verify steps that rejected a draft (state restored, accepted tokens fed again in a later step).",
                    MetricType::Counter);
  Gauge& m_spec_mean = metrics.gauge("flashnext_spec_decode_mean_accepted_length",
                                     "Mean tokens per verify step so far: 1 + accepted drafts / verify steps (0 before "
                                     "the first).");
  Gauge& m_spec_per_pos =
      metrics.gauge("flashnext_spec_decode_num_accepted_tokens_per_pos_total",
                    "Accepted drafts by their position in the draft (label position, from 0).", MetricType::Counter);
  Histogram& m_queue =
      metrics.histogram("flashnext_request_queue_time_seconds",
                        "Time from request arrival to its first admission to the running batch.", kTtftBuckets);
  Histogram& m_request_prompt =
      metrics.histogram("flashnext_request_prompt_tokens", "Prompt tokens of each finished request (aborts included).",
                        buckets_1_2_5(scheduler.config().max_model_len));
  Histogram& m_request_generation = metrics.histogram("flashnext_request_generation_tokens",
                                                      "Generated tokens of each finished request (aborts included).",
                                                      buckets_1_2_5(scheduler.config().max_model_len));

  /// Unknown request fields logged so far (each name once), and what the parse functions do with them for the
  /// request `req` answered by `res` (named in the log line).
  FieldLogger unknown_fields;
  RequestPolicy request_policy(const HttpRequest& req) {
    return RequestPolicy{options.strict_requests, &unknown_fields,
                         fmt::format("{} {} request_id={}", req.method, req.path, req.request_id)};
  }

  /// vLLM's metric names (vllm/v1/metrics/loggers.py), each labelled model_name and engine="0", rendered from the
  /// flashnext metric that measures the same thing: nothing is measured twice.
  void add_vllm_metrics() {
    AliasSpec l;
    l.labels = {{"model_name", model_name()}, {"engine", "0"}};
    metrics.alias("vllm:num_requests_running", "Number of requests in model execution batches.", m_running, l);
    metrics.alias("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m_waiting, l);
    metrics.alias("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m_kv_usage, l);
    metrics.alias("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", m_preemptions, l);
    metrics.alias("vllm:prompt_tokens_total", "Number of prefill tokens processed.", m_prompt_tokens, l);
    metrics.alias("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
                  m_prefix_queries, l);
    metrics.alias("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
                  m_prefix_hits, l);
    metrics.alias("vllm:generation_tokens_total", "Number of generation tokens processed.", m_generation_tokens, l);
    metrics.alias("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", m_spec_drafts, l);
    metrics.alias("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", m_spec_draft_tokens, l);
    metrics.alias("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", m_spec_accepted, l);
    metrics.alias("vllm:spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.",
                  m_spec_per_pos, l);
    // flashnext_requests_total{endpoint, finish_reason} summed over endpoints; tool_calls is the engine's "stop".
    AliasSpec success = l;
    success.relabel = [](const Labels& in) -> std::optional<Labels> {
      for (auto& [k, v] : in) {
        if (k == "finish_reason") return Labels{{"finished_reason", v == "tool_calls" ? "stop" : v}};
      }
      return std::nullopt;
    };
    success.zero_series = {
        {{"finished_reason", "stop"}}, {{"finished_reason", "length"}}, {{"finished_reason", "abort"}}};
    metrics.alias("vllm:request_success_total", "Count of successfully processed requests.", m_requests, success);
    metrics.alias("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m_ttft, l);
    metrics.alias("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m_itl, l);
    metrics.alias("vllm:time_per_output_token_seconds",
                  "Histogram of time per output token in seconds (the same values as "
                  "vllm:inter_token_latency_seconds, its newer name).",
                  m_itl, l);
    metrics.alias("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", m_e2e, l);
    metrics.alias("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", m_queue,
                  l);
    metrics.alias("vllm:request_prompt_tokens", "Number of prefill tokens processed.", m_request_prompt, l);
    metrics.alias("vllm:request_generation_tokens", "Number of generation tokens processed.", m_request_generation, l);
  }

  const std::string& model_name() const { return options.served_model_names.front(); }

  /// The request's speculative decoding (Request::speculative_tokens) under the server's --speculative: -1 the
  /// server's setting, 0 off, 1..K. Throws ApiError(400) naming the field when the server cannot honour it
  /// (speculation asked of a server without it, more drafts than the server's K).
  int speculative_tokens_of(const ApiRequest& ar) const {
    const SpeculativeConfig& spec = scheduler.config().speculative;
    if (ar.speculative == false || ar.num_speculative_tokens == int64_t(0)) return 0;
    if (!spec.enabled()) {
      if (ar.num_speculative_tokens)
        bad_request("num_speculative_tokens",
                    "num_speculative_tokens {} asks for speculative decoding, but this server runs without it (serve "
                    "with --speculative mtp:K or ngram:K)",
                    *ar.num_speculative_tokens);
      if (ar.speculative)
        bad_request("speculative",
                    "speculative: true asks for speculative decoding, but this server runs without it (serve with "
                    "--speculative mtp:K or ngram:K)");
      return -1;
    }
    if (!ar.num_speculative_tokens) return -1;
    if (*ar.num_speculative_tokens > spec.k)
      bad_request("num_speculative_tokens",
                  "num_speculative_tokens {} is more than this server drafts per step (--speculative {}); give 0..{}",
                  *ar.num_speculative_tokens, spec.str(), spec.k);
    return int(*ar.num_speculative_tokens);
  }

  // With reject_control_token_text: throws 400 when a string anywhere in `value` contains a special token's text.
  void check_control_tokens(const json& value, const std::string& where) const {
    if (!options.reject_control_token_text) return;
    if (value.is_string()) {
      const std::string& s = value.get_ref<const std::string&>();
      for (const AddedToken& t : tokenizer.added_tokens()) {
        if (t.special && !t.content.empty() && s.find(t.content) != std::string::npos)
          bad_request(where,
                      "{} contains the control token text \"{}\", which this server does not accept in "
                      "messages",
                      where, t.content);
      }
    } else if (value.is_array()) {
      for (size_t i = 0; i < value.size(); ++i) check_control_tokens(value[i], fmt::format("{}[{}]", where, i));
    } else if (value.is_object()) {
      for (auto it = value.begin(); it != value.end(); ++it) check_control_tokens(it.value(), where + "." + it.key());
    }
  }

  void check_model(const std::string& model) const {
    if (model.empty()) return;
    for (auto& n : options.served_model_names) {
      if (n == model) return;
    }
    // 404 as OpenAI (model_not_found) and vLLM (NotFoundError) answer it.
    throw ApiError(404,
                   fmt::format("the model \"{}\" does not exist; this server serves \"{}\"", clip(model), model_name()),
                   "model");
  }

  // Renders a chat for the template; template errors become 400 with the template's message.
  std::string render_chat(const json& messages, const json& tools, bool add_generation_prompt, const json& vars,
                          bool continue_final) const {
    if (!chat_template) bad_request("messages", "this model has no chat template; use /v1/completions");
    std::string prompt;
    try {
      prompt = chat_template->render(messages, tools, add_generation_prompt, vars.empty() ? json(nullptr) : vars);
    } catch (const chat::jinja::TemplateError& e) {
      bad_request("messages", "the chat template rejected the request: {}",
                  clip(e.raised_by_template() ? e.message() : std::string(e.what()), 300));
    }
    if (continue_final) {
      const std::string& last = messages.back()["content"].get_ref<const std::string&>();
      const size_t pos = last.empty() ? std::string::npos : prompt.rfind(last);
      if (pos == std::string::npos)
        bad_request("continue_final_message",
                    "continue_final_message needs a non-empty final assistant message that the template renders");
      prompt.resize(pos + last.size());
    }
    return prompt;
  }

  // Throws 400 when `text` is too long to be a prompt of at most max_model_len tokens (checked before tokenizing).
  void check_prompt_bytes(const std::string& text, const char* field) const {
    if (text.size() > max_prompt_bytes)
      bad_request(field,
                  "the prompt is {} bytes, more than {} tokens (this model's maximum context length) can hold; "
                  "shorten the {}",
                  text.size(), scheduler.config().max_model_len, field);
  }

  /// `responses`: the body is a Responses API request (/v1/responses), translated to a chat one.
  HttpResponse handle_generation(const HttpRequest& req, Endpoint endpoint, bool responses = false);
  void install_routes();
  /// The HTTP layer's handlers (server/http_server.h): checks on the headers (CORS preflights, the API key, the
  /// POST headers, the route), the routes, and the answers to the requests the HTTP layer refuses.
  std::optional<HttpResponse> on_headers(HttpRequest& req);
  HttpResponse on_request(HttpRequest& req);
  HttpResponse on_error(int status, const std::string& message, const HttpRequest* req);
  /// Adds what every response gets: X-Request-Id and, for an allowed Origin, the CORS headers; logs a successful
  /// answer (errors are logged by log_error, generations by their Session).
  HttpResponse decorate(const HttpRequest* req, HttpResponse res);
  /// An error answer, counted and logged.
  HttpResponse error_response(const HttpRequest* req, int status, const std::string& message,
                              const std::string& param = {}, bool close = false) {
    log_error(req, status, "-", message);
    return json_response(status, error_body(status, message, param), close);
  }
  /// Counts an error answer and logs it: remote address, method, path, status, the completion id ("-" when none),
  /// the request id and the message.
  void log_error(const HttpRequest* req, int status, const std::string& id, const std::string& msg) {
    m_errors.inc(1, {{"status", std::to_string(status)}});
    if (!req) {
      spdlog::info("- - - {} {} request_id=-: {}", status, id, msg);
      return;
    }
    spdlog::info("{} {} {} {} {} request_id={}: {}", req->remote_addr, req->method, clip(req->path, 200), status, id,
                 req->request_id, msg);
  }
};

// ------------------------------------------------------------------------------------------------------------------
// One generation request, from submission to the last byte (runs on the request's HTTP thread).
// ------------------------------------------------------------------------------------------------------------------

class Session {
 public:
  /// One prompt of the request (completions may carry several; chat has one) and its echo text.
  struct Prompt {
    std::vector<int32_t> ids;
    std::string echo_text;
  };

  /// `constraint`: the structured-output constraint of every choice (null: none).
  Session(Server::Impl& srv, ApiRequest req, std::vector<Prompt> prompts, bool starts_in_reasoning,
          std::shared_ptr<const TokenConstraint> constraint, std::string id, Clock::time_point arrival,
          std::string path, std::string request_id, std::string remote)
      : srv_(srv),
        req_(std::move(req)),
        prompts_(std::move(prompts)),
        id_(std::move(id)),
        path_(std::move(path)),
        request_id_(std::move(request_id)),
        remote_(std::move(remote)),
        arrival_(arrival),
        created_(unix_now()) {
    req_.sampling.constraint = std::move(constraint);
    for (size_t p = 0; p < prompts_.size(); ++p) {
      for (int64_t k = 0; k < req_.n; ++k) {
        auto c = std::make_unique<Choice>(srv.tokenizer, srv.generation, req_.sampling, srv.scheduler.vocab_size(),
                                          int64_t(prompts_[p].ids.size()), srv.scheduler.config().max_model_len);
        c->index = int64_t(choices_.size());
        c->prompt = p;
        c->prompt_len = int64_t(prompts_[p].ids.size());
        c->want_prompt_logprobs = req_.prompt_logprobs >= 0;
        if (req_.endpoint == Endpoint::Chat) {
          if (srv.options.reasoning_parser) c->reasoning.emplace(starts_in_reasoning);
          if (req_.parse_tool_calls) c->tools.emplace(req_.tools);
        }
        choices_.push_back(std::move(c));
      }
    }
  }

  /// Submits every choice to the scheduler, the n choices of a prompt as one group (throws Error / QueueFullError;
  /// the choices submitted before a failure are cancelled).
  void submit() {
    try {
      for (size_t p = 0; p < prompts_.size(); ++p) {
        std::vector<Request> group;
        for (auto& c : choices_) {
          if (c->prompt != p) continue;
          Request r;
          r.id = choices_.size() == 1 ? id_ : fmt::format("{}-{}", id_, c->index);
          r.prompt = prompts_[p].ids;
          r.sampling = req_.sampling;
          if (r.sampling.seed) *r.sampling.seed += uint64_t(c->index % req_.n);  // choice i of a prompt: seed + i
          r.top_logprobs = req_.top_logprobs;
          r.prompt_logprobs = req_.prompt_logprobs;
          r.priority = req_.priority;
          r.speculative_tokens = req_.speculative_tokens;
          r.eos_token_ids = srv_.generation.eos_token_ids;
          r.arrival = arrival_;
          c->stream = r.stream;
          group.push_back(std::move(r));
        }
        srv_.scheduler.submit_group(std::move(group));
        srv_.m_prompt_tokens.inc(double(prompts_[p].ids.size()));
      }
    } catch (...) {
      cancel_all();
      throw;
    }
  }

  /// Answer in the Responses API's form (an OpenAI Response object, or its event stream) instead of chat chunks.
  /// The request has one choice.
  void answer_as_responses(std::unique_ptr<ResponsesWriter> writer) { responses_ = std::move(writer); }

  /// The body's producer (HttpResponse::stream), called on the request's HTTP worker again and again: waits up to
  /// 50 ms for the engine, appends what is to be sent now to `body` (possibly a heartbeat, possibly nothing) and
  /// returns false once the body is complete.
  bool pump(std::string& body) {
    if (done_ || complete_) return false;
    std::string out;
    // Waits on the first choice still running (the others are polled): the engine advances them together.
    bool waited = false;
    for (auto& cp : choices_) {
      Choice& c = *cp;
      if (c.finished) continue;
      RequestStream::Update u = c.stream->wait(waited ? Ms(0) : Ms(50));
      waited = true;
      Piece piece;
      take_update(c, u, piece);
      const bool finished = c.output.finished() || u.finish != EndReason::None;
      if (finished) end_choice(c, u, piece);
      if (responses_) {  // the Responses API's events (streaming) or object, instead of chat chunks
        if (req_.stream && !c.started) {
          c.started = true;
          out += responses_->start();
        }
        for (auto& call : piece.calls) c.calls.push_back(call);
        out += responses_->add(piece.reasoning, piece.content, piece.calls);
        if (finished && error_.empty()) out += responses_->finish(c.finish_reason, responses_usage(c));
      } else if (req_.stream) {
        if (!c.started && (c.prompt_logprobs_done() || finished)) out += start_chunk(c);
        if (c.started && piece.any()) out += sse_event(dump_json(delta_chunk(c, piece)));
        if (finished && error_.empty()) out += sse_event(dump_json(final_chunk(c)));
      } else {
        accumulate(c, piece);
      }
    }
    const bool all_done = std::all_of(choices_.begin(), choices_.end(), [](const auto& c) { return c->finished; });
    const bool finished = all_done || !error_.empty();
    if (finished) cancel_all();  // an error ends every choice; a stop string ends the output before the engine does
    if (responses_) {
      if (finished && !error_.empty()) out += responses_->fail(error_);  // a Response with status "failed"
      if (finished && !req_.stream) out = dump_json(responses_->response());
      if (!finished && out.empty() && Clock::now() - last_write_ >= Ms(srv_.options.heartbeat_ms))
        out = req_.stream ? ": keep-alive\n\n" : " ";
    } else if (req_.stream) {
      if (finished) {
        if (!error_.empty()) {
          out += sse_event(dump_json(error_body(error_status_, error_)));
        } else if (req_.include_usage) {
          out += sse_event(dump_json(usage_chunk()));
        }
        out += kSseDone;
      } else if (out.empty() && Clock::now() - last_write_ >= Ms(srv_.options.heartbeat_ms)) {
        // An SSE comment, which clients ignore: notices a vanished client while the request waits in the queue.
        out = ": keep-alive\n\n";
      }
    } else if (finished) {
      out = dump_json(error_.empty() ? full_response() : error_body(error_status_, error_));
    } else if (Clock::now() - last_write_ >= Ms(srv_.options.heartbeat_ms)) {
      // JSON allows whitespace before the value; writing it is how a client that has gone is noticed (the write
      // after its connection closed fails) while the request waits or runs.
      out = " ";
    }
    if (!out.empty()) {
      last_write_ = Clock::now();
      body += out;
    }
    if (finished) complete_ = true;
    return !finished;
  }

  /// The HTTP status of the response as it stands: 200, or the error's once the request has failed.
  int status() const { return error_.empty() ? 200 : error_status_; }

  /// Called when the response has ended (HttpResponse::on_end); `sent` false: the client went away or a write
  /// failed, and the request is cancelled (its sequences leave the engine and free their memory).
  void ended(bool sent) {
    if (done_) return;
    if (sent && complete_) {
      done_ = true;
      record_end();
      return;
    }
    cancel_all();
    done_ = true;
    srv_.m_requests.inc(1, {{"endpoint", endpoint_label()}, {"finish_reason", "abort"}});
    for (const auto& c : choices_) observe_token_counts(*c);
    spdlog::info(
        "{} {} 499 {} request_id={}: response cut off (client gone, write timeout or server stopping) after {} tokens "
        "({:.3f}s)",
        "POST", path_, id_, request_id_, completion_tokens(), seconds_between(arrival_, Clock::now()));
  }

 private:
  // What one update of one choice produced.
  struct Piece {
    std::string content, reasoning;
    std::vector<ToolCall> calls;
    json logprobs = json::array();
    bool any() const { return !content.empty() || !reasoning.empty() || !calls.empty() || !logprobs.empty(); }
  };

  // One choice: a sequence in the engine and what its output has become so far.
  struct Choice {
    Choice(const Tokenizer& t, const GenerationConfig& g, const SamplingParams& p, int64_t vocab, int64_t prompt_len,
           int64_t max_len)
        : output(t, g, p, vocab, prompt_len, max_len) {}
    /// The prompt log-probabilities have all arrived (or none were asked for).
    bool prompt_logprobs_done() const { return !want_prompt_logprobs || int64_t(prompt_lp.size()) >= prompt_len - 1; }

    int64_t index = 0;
    size_t prompt = 0;  // index into prompts_
    int64_t prompt_len = 0;
    bool want_prompt_logprobs = false;
    OutputProcessor output;
    std::optional<ReasoningParser> reasoning;
    std::optional<ToolCallParser> tools;
    std::shared_ptr<RequestStream> stream;
    std::vector<TokenLogprobs> prompt_lp;
    int64_t reasoning_tokens = 0;  // tokens whose text went to reasoning
    int64_t cached_tokens = 0;     // prompt tokens found in the prefix cache at its first admission
    bool started = false, finished = false;
    std::string finish_reason;
    size_t text_offset = 0;  // characters of text sent so far (completions' logprobs offsets)
    std::optional<Clock::time_point> first_token;
    Clock::time_point last_token{};
    // Non-streaming accumulation (streaming: calls counts the calls sent, for their indices).
    std::string content, reasoning_text;
    std::vector<ToolCall> calls;
    json logprobs = json::array();
  };

  const char* endpoint_label() const {
    return responses_ ? "responses" : req_.endpoint == Endpoint::Chat ? "chat" : "completions";
  }
  ResponsesUsage responses_usage(const Choice& c) const {
    return {int64_t(prompts_[c.prompt].ids.size()), int64_t(c.output.token_ids().size()), c.reasoning_tokens,
            c.cached_tokens};
  }
  bool echo_prompt_logprobs() const {
    return req_.endpoint == Endpoint::Completion && req_.echo && req_.top_logprobs >= 0;
  }

  void cancel_all() {
    for (auto& c : choices_) {
      if (c->stream) c->stream->cancel();
    }
  }

  int64_t completion_tokens() const {
    int64_t n = 0;
    for (auto& c : choices_) n += int64_t(c->output.token_ids().size());
    return n;
  }

  void take_update(Choice& c, const RequestStream::Update& u, Piece& piece) {
    if (u.scheduled) {
      srv_.m_queue.observe(seconds_between(arrival_, *u.scheduled));
      c.cached_tokens = u.cached_tokens;
    }
    for (auto& lp : u.prompt_logprobs) c.prompt_lp.push_back(lp);
    for (size_t i = 0; i < u.tokens.size(); ++i) {
      // Latency is measured when the engine produced the token.
      if (!c.first_token) {
        c.first_token = u.times[i];
        srv_.m_ttft.observe(seconds_between(arrival_, u.times[i]));
      } else {
        srv_.m_itl.observe(seconds_between(c.last_token, u.times[i]));
      }
      c.last_token = u.times[i];
      if (c.output.finished()) continue;  // produced after a stop string: not part of the output
      const TokenDelta d = c.output.append(u.tokens[i]);
      srv_.m_generation_tokens.inc();
      if (req_.top_logprobs >= 0 && i < u.logprobs.size()) add_logprobs(u.tokens[i], u.logprobs[i], piece);
      route(c, d.text, piece);
    }
  }

  void end_choice(Choice& c, const RequestStream::Update& u, Piece& piece) {
    c.finished = true;
    c.stream->cancel();  // the output ended (a stop string may end it before the engine does)
    if (!c.output.finished() && (u.finish == EndReason::Stop || u.finish == EndReason::Length) &&
        req_.sampling.max_tokens > 0) {
      spdlog::warn("{} request_id={}: the engine ended choice {} ({}) before its output did", id_, request_id_, c.index,
                   end_reason_name(u.finish));
    }
    flush_parsers(c, piece);
    if (c.output.finished()) {
      c.finish_reason = finish_reason_name(c.output.finish_reason());
    } else if (u.finish == EndReason::Error) {
      error_status_ = 500;
      error_ = "the engine failed on this request: " + u.error;
    } else if (u.finish == EndReason::Abort) {
      if (error_.empty()) {
        error_status_ = 503;
        error_ = "the request was aborted: the server is shutting down";
      }
    } else {
      c.finish_reason = end_reason_name(u.finish);
    }
    if (c.finish_reason == "stop" && (!c.calls.empty() || !piece.calls.empty())) c.finish_reason = "tool_calls";
  }

  // Sends generated text through the reasoning and tool-call parsers.
  void route(Choice& c, const std::string& text, Piece& piece) {
    if (text.empty()) return;
    std::string content = text;
    if (c.reasoning) {
      auto r = c.reasoning->feed(text);
      if (!r.reasoning.empty()) ++c.reasoning_tokens;  // route() runs once per generated token
      piece.reasoning += r.reasoning;
      content = std::move(r.content);
    }
    route_content(c, content, piece);
  }
  void route_content(Choice& c, const std::string& content, Piece& piece) {
    if (!c.tools) {
      piece.content += content;
      return;
    }
    auto t = c.tools->feed(content);
    piece.content += t.content;
    for (auto& call : t.calls) piece.calls.push_back(std::move(call));
  }
  void flush_parsers(Choice& c, Piece& piece) {
    if (c.reasoning) {
      auto r = c.reasoning->finish();
      piece.reasoning += r.reasoning;
      route_content(c, r.content, piece);
    }
    if (c.tools) {
      auto t = c.tools->finish();
      piece.content += t.content;
      for (auto& call : t.calls) piece.calls.push_back(std::move(call));
    }
  }

  std::string token_text(int32_t id) const {
    if (req_.tokens_as_ids) return fmt::format("token_id:{}", id);
    return srv_.tokenizer.decode(std::span<const int32_t>(&id, 1));
  }
  json token_bytes(int32_t id) const {
    json b = json::array();
    for (unsigned char c : srv_.tokenizer.token_bytes(id)) b.push_back(int(c));
    return b;
  }
  size_t token_chars(int32_t id) const {  // code points of the decoded token (OpenAI's text_offset unit)
    const std::string text = srv_.tokenizer.decode(std::span<const int32_t>(&id, 1));
    return size_t(std::count_if(text.begin(), text.end(), [](char ch) { return (ch & 0xC0) != 0x80; }));
  }

  void add_logprobs(int32_t token, const TokenLogprobs& lp, Piece& piece) {
    if (req_.endpoint == Endpoint::Chat) {
      json top = json::array();
      for (auto& [id, l] : lp.top)
        top.push_back({{"token", token_text(id)}, {"logprob", l}, {"bytes", token_bytes(id)}});
      piece.logprobs.push_back({{"token", token_text(token)},
                                {"logprob", lp.logprob},
                                {"bytes", token_bytes(token)},
                                {"top_logprobs", top}});
    } else {
      json top = json::object();
      for (auto& [id, l] : lp.top) top[token_text(id)] = l;
      piece.logprobs.push_back(
          {{"token", token_text(token)}, {"logprob", lp.logprob}, {"top", top}, {"chars", token_chars(token)}});
    }
  }

  // Completions' legacy logprobs entries of the echoed prompt: the first token has none (null).
  json echo_logprob_entries(const Choice& c) const {
    json out = json::array();
    const auto& ids = prompts_[c.prompt].ids;
    for (size_t i = 0; i < ids.size(); ++i) {
      json e = {{"token", token_text(ids[i])}, {"logprob", nullptr}, {"top", nullptr}, {"chars", token_chars(ids[i])}};
      if (i > 0 && i - 1 < c.prompt_lp.size()) {
        const TokenLogprobs& lp = c.prompt_lp[i - 1];
        json top = json::object();
        for (auto& [id, l] : lp.top) top[token_text(id)] = l;
        top[token_text(ids[i])] = lp.logprob;  // the prompt token itself, as OpenAI's echo shows it
        e["logprob"] = lp.logprob;
        e["top"] = top;
      }
      out.push_back(std::move(e));
    }
    return out;
  }

  // vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...] (the prompt token and
  // the top alternatives of each position after the first).
  json prompt_logprobs_json(const Choice& c) const {
    if (req_.prompt_logprobs < 0) return nullptr;
    json out = json::array({nullptr});
    const auto& ids = prompts_[c.prompt].ids;
    for (size_t i = 0; i < c.prompt_lp.size() && i + 1 < ids.size(); ++i) {
      const TokenLogprobs& lp = c.prompt_lp[i];
      json pos = json::object();
      const int32_t tok = ids[i + 1];
      int64_t rank = 1;  // 1 + the alternatives more likely than the prompt token (among those listed)
      for (auto& [id, l] : lp.top) rank += l > lp.logprob && id != tok;
      pos[std::to_string(tok)] = {{"logprob", lp.logprob}, {"rank", rank}, {"decoded_token", token_text(tok)}};
      for (size_t k = 0; k < lp.top.size(); ++k) {
        const auto& [id, l] = lp.top[k];
        if (id == tok) continue;
        pos[std::to_string(id)] = {{"logprob", l}, {"rank", int64_t(k) + 1}, {"decoded_token", token_text(id)}};
      }
      out.push_back(std::move(pos));
    }
    return out;
  }

  // Completions' legacy logprobs object for `entries` ({"token", "logprob", "top", "chars"}), offsets from `offset`
  // (characters).
  json completion_logprobs(const json& entries, size_t offset) const {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const json& e : entries) {
      tokens.push_back(e["token"]);
      lps.push_back(e["logprob"]);
      tops.push_back(e["top"]);
      offsets.push_back(offset);
      offset += e["chars"].get<size_t>();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  json tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index, bool with_index) const {
    json out = json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
      json c;
      if (with_index) c["index"] = first_index + k;
      c["id"] = calls[k].id;
      c["type"] = "function";
      c["function"] = {{"name", calls[k].name}, {"arguments", calls[k].arguments}};
      out.push_back(std::move(c));
    }
    return out;
  }

  // prompt_tokens_details.cached_tokens (vLLM's): the prompt tokens found in the prefix cache, each prompt counted
  // once (its n choices share one prefill and one admission).
  json usage() const {
    int64_t p = 0;
    for (const auto& pr : prompts_) p += int64_t(pr.ids.size());  // n choices of a prompt count it once (vLLM)
    std::vector<int64_t> cached(prompts_.size(), 0);
    for (const auto& ch : choices_) cached[ch->prompt] = std::max(cached[ch->prompt], ch->cached_tokens);
    int64_t cached_total = 0;
    for (int64_t v : cached) cached_total += v;
    const int64_t c = completion_tokens();
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached_total}}}};
  }

  // The per-request token histograms for a choice that ended (aborts included, as vLLM counts them; each choice
  // of an n > 1 request counts, as vLLM's child requests do).
  void observe_token_counts(const Choice& c) {
    srv_.m_request_prompt.observe(double(prompts_[c.prompt].ids.size()));
    srv_.m_request_generation.observe(double(c.output.token_ids().size()));
  }

  json stop_reason(const Choice& c) const {
    if (!c.output.stop_string().empty()) return c.output.stop_string();
    const auto& ids = req_.sampling.stop_token_ids;
    if (c.output.stop_token() >= 0 && std::find(ids.begin(), ids.end(), c.output.stop_token()) != ids.end())
      return c.output.stop_token();
    return nullptr;
  }

  json chunk_base() const {
    return {{"id", id_},
            {"object", req_.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", srv_.model_name()}};
  }

  // The first chunk of a choice: the role (chat) and the echoed text, with its logprobs when asked for.
  std::string start_chunk(Choice& c) {
    c.started = true;
    json ch = chunk_base();
    const std::string& echo = prompts_[c.prompt].echo_text;
    if (req_.endpoint == Endpoint::Chat) {
      ch["choices"] = json::array({{{"index", c.index},
                                    {"delta", {{"role", "assistant"}, {"content", echo}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", nullptr}}});
    } else {
      json lp = nullptr;
      if (echo_prompt_logprobs()) {
        const json entries = echo_logprob_entries(c);
        lp = completion_logprobs(entries, 0);
        for (const json& e : entries) c.text_offset += e["chars"].get<size_t>();
      } else {
        c.text_offset += size_t(std::count_if(echo.begin(), echo.end(), [](char x) { return (x & 0xC0) != 0x80; }));
      }
      ch["choices"] = json::array({{{"index", c.index}, {"text", echo}, {"logprobs", lp}, {"finish_reason", nullptr}}});
    }
    return sse_event(dump_json(ch));
  }

  json delta_chunk(Choice& c, const Piece& piece) {
    json ch = chunk_base();
    json choice;
    choice["index"] = c.index;
    if (req_.endpoint == Endpoint::Chat) {
      json delta = json::object();
      if (!piece.reasoning.empty()) delta["reasoning_content"] = piece.reasoning;
      if (!piece.content.empty()) delta["content"] = piece.content;
      if (!piece.calls.empty()) delta["tool_calls"] = tool_calls_json(piece.calls, c.calls.size(), true);
      choice["delta"] = delta;
      choice["logprobs"] = piece.logprobs.empty() ? json(nullptr) : json{{"content", piece.logprobs}};
    } else {
      choice["text"] = piece.content;
      choice["logprobs"] = piece.logprobs.empty() ? json(nullptr) : completion_logprobs(piece.logprobs, c.text_offset);
      for (const json& e : piece.logprobs) c.text_offset += e["chars"].get<size_t>();
    }
    choice["finish_reason"] = nullptr;
    ch["choices"] = json::array({choice});
    for (auto& call : piece.calls) c.calls.push_back(call);
    return ch;
  }

  json final_chunk(const Choice& c) const {
    json ch = chunk_base();
    json choice = {{"index", c.index}};
    if (req_.endpoint == Endpoint::Chat)
      choice["delta"] = json::object();
    else
      choice["text"] = "";
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = c.finish_reason;
    choice["stop_reason"] = stop_reason(c);
    if (req_.prompt_logprobs >= 0 && !echo_prompt_logprobs()) choice["prompt_logprobs"] = prompt_logprobs_json(c);
    ch["choices"] = json::array({choice});
    return ch;
  }

  json usage_chunk() const {
    json ch = chunk_base();
    ch["choices"] = json::array();
    ch["usage"] = usage();
    return ch;
  }

  void accumulate(Choice& c, Piece& piece) {
    c.content += piece.content;
    c.reasoning_text += piece.reasoning;
    for (auto& call : piece.calls) c.calls.push_back(std::move(call));
    for (auto& e : piece.logprobs) c.logprobs.push_back(std::move(e));
  }

  json full_choice(const Choice& c) const {
    json choice = {{"index", c.index}};
    const std::string& echo = prompts_[c.prompt].echo_text;
    if (req_.endpoint == Endpoint::Chat) {
      json msg = {{"role", "assistant"}};
      const std::string content = echo + c.content;
      msg["content"] = content.empty() && !c.calls.empty() ? json(nullptr) : json(content);
      msg["reasoning_content"] = c.reasoning_text.empty() ? json(nullptr) : json(c.reasoning_text);
      msg["tool_calls"] = tool_calls_json(c.calls, 0, false);
      choice["message"] = msg;
      choice["logprobs"] = req_.top_logprobs >= 0 ? json{{"content", c.logprobs}} : json(nullptr);
    } else {
      choice["text"] = echo + c.content;
      if (echo_prompt_logprobs()) {
        json entries = echo_logprob_entries(c);
        for (const json& e : c.logprobs) entries.push_back(e);
        choice["logprobs"] = completion_logprobs(entries, 0);
      } else {
        choice["logprobs"] = req_.top_logprobs >= 0 ? completion_logprobs(c.logprobs, 0) : json(nullptr);
      }
    }
    choice["finish_reason"] = c.finish_reason;
    choice["stop_reason"] = stop_reason(c);
    if (req_.prompt_logprobs >= 0 && !echo_prompt_logprobs()) choice["prompt_logprobs"] = prompt_logprobs_json(c);
    return choice;
  }

  json full_response() const {
    json choices = json::array();
    for (const auto& c : choices_) choices.push_back(full_choice(*c));
    return {{"id", id_},           {"object", req_.endpoint == Endpoint::Chat ? "chat.completion" : "text_completion"},
            {"created", created_}, {"model", srv_.model_name()},
            {"choices", choices},  {"usage", usage()}};
  }

  void record_end() {
    const auto now = Clock::now();
    std::optional<Clock::time_point> first;
    Clock::time_point last{};
    std::string reasons;
    for (const auto& c : choices_) {
      if (c->first_token && (!first || *c->first_token < *first)) first = c->first_token;
      last = std::max(last, c->last_token);
      if (reasons.find(c->finish_reason) == std::string::npos)
        reasons += (reasons.empty() ? "" : ",") + c->finish_reason;
    }
    if (error_.empty()) {
      for (const auto& c : choices_) {
        srv_.m_requests.inc(1, {{"endpoint", endpoint_label()}, {"finish_reason", c->finish_reason}});
        observe_token_counts(*c);
      }
      srv_.m_e2e.observe(seconds_between(arrival_, last == Clock::time_point{} ? now : last));
    } else {
      srv_.m_errors.inc(1, {{"status", std::to_string(error_status_)}});
    }
    int64_t prompt_tokens = 0;
    for (const auto& p : prompts_) prompt_tokens += int64_t(p.ids.size());
    const double ttft = first ? seconds_between(arrival_, *first) : 0;
    spdlog::info("{} POST {} {} {} request_id={}: prompt={} completion={}{} finish={} ttft={:.3f}s e2e={:.3f}s{}{}",
                 remote_, path_, error_.empty() ? 200 : error_status_, id_, request_id_, prompt_tokens,
                 completion_tokens(), choices_.size() > 1 ? fmt::format(" choices={}", choices_.size()) : std::string(),
                 error_.empty() ? reasons : "error", ttft, seconds_between(arrival_, now), req_.stream ? " stream" : "",
                 error_.empty() ? "" : " error: " + error_);
  }

  Server::Impl& srv_;
  ApiRequest req_;
  std::vector<Prompt> prompts_;
  std::string id_, path_, request_id_, remote_;
  Clock::time_point arrival_;
  int64_t created_;
  std::vector<std::unique_ptr<Choice>> choices_;  // prompt-major: choice i is sample i % n of prompt i / n
  std::unique_ptr<ResponsesWriter> responses_;    // set: a /v1/responses request

  bool done_ = false;      // ended() has run (or the body was sent whole)
  bool complete_ = false;  // pump() has produced the whole body
  Clock::time_point last_write_ = Clock::now();
  std::string error_;
  int error_status_ = 0;
};

HttpResponse Server::Impl::handle_generation(const HttpRequest& req, Endpoint endpoint, bool responses) {
  const std::string& body_text = req.body;
  const Clock::time_point arrival = Clock::now();
  const char* prefix = responses ? "resp_" : endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-";
  const std::string id = prefix + random_hex(16) + std::to_string(next_id++);
  std::shared_ptr<Session> session;
  bool stream = false;
  std::optional<ResponsesRequest> rr;  // a /v1/responses request, translated to `body`
  try {
    json body = parse_body(body_text, options.json_limits);
    const RequestPolicy policy = request_policy(req);
    if (responses) body = (rr = translate_responses_request(body, policy))->chat;
    const int64_t vocab = scheduler.vocab_size();
    ApiRequest ar = endpoint == Endpoint::Chat
                        ? parse_chat_request(body, generation.default_sampling(), vocab, policy)
                        : parse_completion_request(body, generation.default_sampling(), vocab, policy);
    check_model(ar.model);
    std::vector<Session::Prompt> prompts;
    bool starts_in_reasoning = false;
    if (endpoint == Endpoint::Chat) {
      check_control_tokens(ar.messages, "messages");
      check_control_tokens(ar.tools, "tools");
      const std::string text =
          render_chat(ar.messages, ar.tools, ar.add_generation_prompt, ar.template_vars, ar.continue_final_message);
      check_prompt_bytes(text, "messages");
      Session::Prompt p;
      p.ids = tokenizer.encode(text, /*parse_special=*/true);
      starts_in_reasoning = ReasoningParser::prompt_opens_reasoning(text);
      if (ar.echo && ar.messages.back()["role"] == "assistant")
        p.echo_text = ar.messages.back()["content"].get<std::string>();
      prompts.push_back(std::move(p));
    } else {
      for (const CompletionPrompt& cp : ar.prompts) {
        if (cp.text) check_prompt_bytes(*cp.text, "prompt");
        Session::Prompt p;
        p.ids = cp.text ? tokenizer.encode(*cp.text, /*parse_special=*/true) : cp.ids;
        if (ar.echo) p.echo_text = cp.text ? *cp.text : tokenizer.decode(p.ids);
        prompts.push_back(std::move(p));
      }
    }
    const char* prompt_field = endpoint == Endpoint::Chat ? "messages" : "prompt";
    const int64_t max_len = scheduler.config().max_model_len;
    int64_t longest = 0;
    for (const auto& p : prompts) {
      const int64_t n = int64_t(p.ids.size());
      if (n == 0) bad_request(prompt_field, "the prompt is empty after tokenization");
      if (n >= max_len)
        bad_request(prompt_field,
                    "this model's maximum context length is {} tokens, but the prompt has {} tokens; shorten the {}",
                    max_len, n, prompt_field);
      longest = std::max(longest, n);
    }
    const int64_t n = longest;
    if (!ar.max_tokens_given) {
      ar.sampling.max_tokens = max_len - n;
      if (generation.max_new_tokens)
        ar.sampling.max_tokens = std::min(ar.sampling.max_tokens, *generation.max_new_tokens);
    } else if (ar.sampling.max_tokens > max_len - n) {  // n < max_len: no overflow, whatever max_tokens is
      bad_request("max_tokens",
                  "this model's maximum context length is {} tokens, but {} tokens were requested ({} in the prompt, "
                  "{} in the completion); reduce the prompt or max_tokens",
                  max_len, fmt::to_string(__int128(n) + ar.sampling.max_tokens), n, ar.sampling.max_tokens);
    }
    if (ar.sampling.min_tokens > ar.sampling.max_tokens)
      bad_request("min_tokens", "min_tokens ({}) must be <= max_tokens ({})", ar.sampling.min_tokens,
                  ar.sampling.max_tokens);
    if (ar.priority != 0 && scheduler.config().policy != SchedulingPolicy::Priority)
      bad_request("priority",
                  "priority {} given, but the server schedules FCFS (serve with --scheduling-policy priority)",
                  ar.priority);
    ar.speculative_tokens = speculative_tokens_of(ar);
    std::shared_ptr<const TokenConstraint> constraint = structured.constraint_for(ar, starts_in_reasoning);
    stream = ar.stream;
    if (rr) {  // the Response object reports the sampling settings the request runs with
      if (ar.n != 1) bad_request("n", "the Responses API returns one output");
      rr->echo["temperature"] = ar.sampling.temperature;
      rr->echo["top_p"] = ar.sampling.top_p;
    }
    session = std::make_shared<Session>(*this, std::move(ar), std::move(prompts), starts_in_reasoning,
                                        std::move(constraint), id, arrival, req.path, req.request_id, req.remote_addr);
    if (rr)
      session->answer_as_responses(
          std::make_unique<ResponsesWriter>(std::move(rr->echo), id, model_name(), unix_now(), stream));
    session->submit();
  } catch (const ApiError& error) {
    const ApiError e = rr ? rr->remap(error) : error;  // chat field names -> the Responses fields they came from
    log_error(&req, e.status(), id, e.what());
    return json_response(e.status(), error_body(e.status(), e.what(), e.param()));
  } catch (const QueueFullError& e) {
    log_error(&req, 503, id, e.what());
    return json_response(503, error_body(503, e.what()));
  } catch (const Error& e) {  // the engine's checks (prompt ids, sampling, lengths)
    log_error(&req, 400, id, e.what());
    return json_response(400, error_body(400, e.what()));
  }
  HttpResponse res;
  res.headers = {{"Content-Type", stream ? "text/event-stream" : "application/json"}, {"Cache-Control", "no-cache"}};
  res.stream = [session](std::string& out) { return session->pump(out); };
  res.on_end = [session](bool sent) { session->ended(sent); };
  // A non-streaming request that failed before its first heartbeat answers with its error status (as vLLM does);
  // a stream has said 200 with its first event and reports errors in the stream.
  if (!stream) res.status_before_head = [session] { return session->status(); };
  return res;
}

// ------------------------------------------------------------------------------------------------------------------

void Server::Impl::install_routes() {
  // POST routes get their body whole, read by the HTTP layer within --max-request-bytes and --body-timeout.
  post_routes["/v1/chat/completions"] = [this](HttpRequest& req) { return handle_generation(req, Endpoint::Chat); };
  post_routes["/v1/completions"] = [this](HttpRequest& req) { return handle_generation(req, Endpoint::Completion); };
  post_routes["/v1/responses"] = [this](HttpRequest& req) {
    return handle_generation(req, Endpoint::Chat, /*responses=*/true);
  };
  get_routes["/v1/models"] = [this](HttpRequest&) {
    json data = json::array();
    for (auto& name : options.served_model_names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "flashnext"},
                      {"root", options.model_dir},
                      {"parent", nullptr},
                      {"max_model_len", scheduler.config().max_model_len}});
    }
    return json_response(200, {{"object", "list"}, {"data", data}});
  };
  get_routes["/health"] = [this](HttpRequest&) {
    if (const std::string why = options.failure ? options.failure() : std::string(); !why.empty())
      return json_response(503, error_body(503, "the engine cannot serve: " + why));
    return HttpResponse{};
  };
  get_routes["/version"] = [this](HttpRequest&) { return json_response(200, {{"version", options.version}}); };
  get_routes["/metrics"] = [this](HttpRequest&) {
    const SchedulerStats s = scheduler.stats();
    m_running.set(double(s.running));
    m_waiting.set(double(s.waiting));
    m_kv_usage.set(s.kv_usage);
    m_kv_blocks.set(double(s.kv_blocks_used), {{"state", "used"}});
    m_kv_blocks.set(double(s.kv_blocks_total), {{"state", "total"}});
    m_slots.set(double(s.slots_used), {{"state", "used"}});
    m_slots.set(double(s.slots_total), {{"state", "total"}});
    m_preemptions.set(double(s.preemptions));
    m_ple_rows.set(double(s.ple_rows_fetched));
    m_steps.set(double(s.steps));
    m_prefix_queries.set(double(s.prefix_cache_queries));
    m_prefix_hits.set(double(s.prefix_cache_hits));
    m_prefix_blocks.set(double(s.prefix_cache_blocks));
    m_prefix_snapshots.set(double(s.prefix_cache_snapshots));
    m_spec_drafts.set(double(s.spec_verify_steps));
    m_spec_draft_tokens.set(double(s.spec_drafted));
    m_spec_accepted.set(double(s.spec_accepted));
    m_spec_emitted.set(double(s.spec_emitted));
    m_spec_rollbacks.set(double(s.spec_rollbacks));
    m_spec_mean.set(s.spec_verify_steps ? 1.0 + double(s.spec_accepted) / double(s.spec_verify_steps) : 0.0);
    for (size_t i = 0; i < s.spec_accepted_per_pos.size(); ++i)
      m_spec_per_pos.set(double(s.spec_accepted_per_pos[i]), {{"position", std::to_string(i)}});
    HttpResponse res;
    res.headers.emplace_back("Content-Type", "text/plain; version=0.0.4");
    res.body = metrics.render();
    return res;
  };
  post_routes["/tokenize"] = [this](HttpRequest& req) {
    const TokenizeRequest tr = parse_tokenize_request(parse_body(req.body, options.json_limits), request_policy(req));
    check_model(tr.model);
    const std::string text =
        tr.prompt ? *tr.prompt : render_chat(tr.messages, tr.tools, tr.add_generation_prompt, tr.template_vars, false);
    check_prompt_bytes(text, tr.prompt ? "prompt" : "messages");  // before the tokenizer spends time on it
    const std::vector<int32_t> ids = tokenizer.encode(text, /*parse_special=*/true);
    json out = {{"count", ids.size()}, {"max_model_len", scheduler.config().max_model_len}, {"tokens", ids}};
    if (tr.return_token_strs) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(tokenizer.id_to_token(id).value_or(""));
      out["token_strs"] = strs;
    } else {
      out["token_strs"] = nullptr;
    }
    return json_response(200, out);
  };
  post_routes["/detokenize"] = [this](HttpRequest& req) {
    const DetokenizeRequest dr = parse_detokenize_request(parse_body(req.body, options.json_limits),
                                                          scheduler.vocab_size(), request_policy(req));
    check_model(dr.model);
    return json_response(200, {{"prompt", tokenizer.decode(dr.tokens)}});
  };

  const SchedulerConfig& sc = scheduler.config();
  HttpOptions ho;
  ho.host = options.host;
  ho.port = options.port;
  ho.worker_threads = options.http_threads > 0 ? options.http_threads : int(sc.max_num_seqs + sc.max_waiting + 16);
  ho.max_connections = options.max_connections;
  ho.max_body_bytes = options.max_request_bytes;
  ho.header_timeout_s = options.header_timeout_s;
  ho.read_timeout_s = options.read_timeout_s;
  ho.body_timeout_s = options.body_timeout_s;
  ho.write_timeout_s = options.write_timeout_s;
  ho.keep_alive_timeout_s = options.keep_alive_timeout_s;
  HttpHandlers handlers;
  handlers.headers = [this](HttpRequest& req) { return on_headers(req); };
  handlers.request = [this](HttpRequest& req) { return on_request(req); };
  handlers.error = [this](int status, const std::string& message, const HttpRequest* req) {
    return on_error(status, message, req);
  };
  http = std::make_unique<HttpServer>(std::move(ho), std::move(handlers));
}

// Checks made on the headers, before any body is read (a request answered here has its connection closed when it
// announced a body). The request id is settled first, so that every log line can name it; a CORS preflight is
// answered before authentication (browsers send it without credentials).
std::optional<HttpResponse> Server::Impl::on_headers(HttpRequest& req) {
  req.request_id = request_id_for(req.header("X-Request-Id"));
  try {
    if (options.cors.enabled()) {
      const std::string origin = req.header("Origin");
      const std::string method = req.header("Access-Control-Request-Method");
      if (is_cors_preflight(req.method, origin, method)) {
        const PreflightAnswer a =
            cors_preflight(options.cors, origin, method, req.header("Access-Control-Request-Headers"));
        HttpResponse res;
        if (a.status == 200) {
          res.headers.emplace_back("Content-Type", "text/plain");
          res.body = "OK";
        } else {
          res = error_response(&req, 400,
                               fmt::format("disallowed CORS {} (preflight from origin \"{}\" for method \"{}\")",
                                           a.failure, clip(origin, 100), clip(method, 20)));
        }
        for (const auto& [k, v] : a.headers) res.headers.emplace_back(k, v);
        return decorate(&req, std::move(res));
      }
    }
    if (!options.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
        req.header("Authorization") != "Bearer " + options.api_key) {
      log_error(&req, 401, "-", "missing or wrong API key");
      return decorate(&req, json_response(401,
                                          error_body(401,
                                                     "invalid or missing API key (send \"Authorization: "
                                                     "Bearer <key>\")"),
                                          /*close=*/true));
    }
    if (req.method == "POST") {
      if (auto refused = check_post_headers(header_of(req, "Content-Type"), header_of(req, "Content-Length"),
                                            header_of(req, "Transfer-Encoding"), header_of(req, "Content-Encoding"),
                                            options.max_request_bytes))
        return decorate(&req, error_response(&req, refused->status, refused->message));
    }
    const bool get = req.method == "GET" || req.method == "HEAD";
    const auto& routes = get ? get_routes : post_routes;
    if ((!get && req.method != "POST") || !routes.count(req.path)) {
      const bool as_get = get_routes.count(req.path) > 0, as_post = post_routes.count(req.path) > 0;
      if (!as_get && !as_post)
        return decorate(
            &req,
            error_response(&req, 404, fmt::format("no route for {} {}", clip(req.method, 16), clip(req.path, 200))));
      // A route of another method: 405 with the methods it takes (RFC 9110 15.5.6).
      const std::string allow = as_get && as_post ? "GET, HEAD, POST" : as_get ? "GET, HEAD" : "POST";
      HttpResponse res = error_response(
          &req, 405, fmt::format("{} {}: method not allowed (allowed: {})", clip(req.method, 16), req.path, allow));
      res.headers.emplace_back("Allow", allow);
      return decorate(&req, std::move(res));
    }
  } catch (const std::exception& e) {
    return decorate(&req, error_response(&req, 500, fmt::format("internal error: {}", e.what())));
  }
  return std::nullopt;
}

// A route's answer; a failure becomes an OpenAI error (ApiError: its status; Error: 400; anything else: 500).
HttpResponse Server::Impl::on_request(HttpRequest& req) {
  const bool large = req.body.size() >= kTrimAfterBytes || req.body.capacity() >= kTrimAfterBytes;
  HttpResponse res;
  try {
    const auto& routes = req.method == "POST" ? post_routes : get_routes;
    res = routes.find(req.path)->second(req);  // on_headers let only routed requests through
  } catch (const ApiError& e) {
    res = error_response(&req, e.status(), e.what(), e.param());
  } catch (const Error& e) {
    res = error_response(&req, 400, e.what());
  } catch (const std::exception& e) {
    res = error_response(&req, 500, fmt::format("internal error: {}", e.what()));
  } catch (...) {
    res = error_response(&req, 500, "internal error");
  }
  // After a large request, the heap it freed goes back to the system once its answer is sent (each worker thread's
  // malloc arena would otherwise keep its peak size).
  if (large) {
    res.on_end = [then = std::move(res.on_end)](bool sent) {
      if (then) then(sent);
      malloc_trim(0);
      spdlog::debug("server: heap trimmed after a large request");
    };
  }
  return decorate(&req, std::move(res));
}

// Requests the HTTP layer refuses: malformed, over a size limit, too slow, over the connection cap.
HttpResponse Server::Impl::on_error(int status, const std::string& message, const HttpRequest* req) {
  if (status == 503 && !req) {  // over --max-connections: counted always, logged at most once a second
    m_errors.inc(1, {{"status", "503"}});
    const int64_t now = std::chrono::duration_cast<Ms>(Clock::now().time_since_epoch()).count();
    int64_t last = last_cap_log_ms.load();
    if (now - last >= 1000 && last_cap_log_ms.compare_exchange_strong(last, now))
      spdlog::warn("server: refused a connection: {}", message);
    return decorate(nullptr, json_response(status, error_body(status, message), /*close=*/true));
  }
  return decorate(req, error_response(req, status, message, {}, /*close=*/true));
}

HttpResponse Server::Impl::decorate(const HttpRequest* req, HttpResponse res) {
  const std::string id = req && !req->request_id.empty() ? req->request_id : random_request_id();
  res.headers.emplace_back("X-Request-Id", id);
  if (req && options.cors.enabled() && !has_header(res, "Access-Control-Allow-Origin")) {
    for (auto& h : cors_response_headers(options.cors, req->header("Origin"))) res.headers.push_back(std::move(h));
  }
  if (req && res.status < 400 && req->path != "/v1/chat/completions" && req->path != "/v1/completions" &&
      req->path != "/v1/responses")
    spdlog::info("{} {} {} {} request_id={}", req->remote_addr, req->method, req->path, res.status, id);
  return res;
}

// ------------------------------------------------------------------------------------------------------------------

size_t default_max_request_bytes(int64_t max_model_len) {
  return (size_t(1) << 20) + 32 * size_t(std::max<int64_t>(max_model_len, 0));
}

Server::Server(Scheduler& scheduler, const Tokenizer& tokenizer, const chat::ChatTemplate* chat_template,
               const GenerationConfig& generation, ServerOptions options) {
  FN_CHECK(!options.served_model_names.empty(), "server: at least one served model name is needed");
  impl_ = std::make_unique<Impl>(scheduler, tokenizer, chat_template, generation, std::move(options));
  impl_->install_routes();
}

Server::~Server() {
  stop();
}

int Server::bind() {
  const int port = impl_->http->bind();
  impl_->options.port = port;
  return port;
}

void Server::run() {
  impl_->http->run();
}

void Server::stop() {
  if (impl_ && impl_->http) impl_->http->stop();
}

}  // namespace flashnext::server
