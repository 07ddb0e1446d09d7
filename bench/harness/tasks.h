// Retrieval tasks of the harness (`kvprune eval --task`, issue 19): deterministic prompt
// generators on held-out text (the haystack), scorers, and the grid runner.
//
//   passkey        " The pass key is NNNNN. Remember it. NNNNN is the pass key. " at a depth of the
//                  haystack; question " What is the pass key? The pass key is "; answer the 5 digits.
//   niah           RULER's niah_single needle " One of the special magic numbers for WORD is: NNNNNNN. ";
//                  byte models get the cloze form of the question (it ends with the needle's own key
//                  phrase "... for WORD is: "); answer the 7 digits.
//   niah-multikey  four such needles with different WORDs; one is asked (the others are distractors
//                  at seeded depths that do not overlap it).
//   recall         a 64-byte held-out passage at a depth; the prompt ends with its first 16 bytes
//                  again; answer its next 32 bytes (scored per byte, plus exact match and the NLL
//                  of the true continuation).
//
// Depth d in [0, 1]: the asked block starts at byte round(d * (C - B)) of the context (C bytes
// before the question, B the block's bytes), so d = 0 puts it first and d = 1 right before the
// question. Every prompt has exactly the requested length. The haystack and the key of a sample do
// not depend on the depth (the heatmap's rows share them). Generation is a pure function of
// (task, text, length, depth, sample, seed): splitmix64 seeded by FNV-1a of "task/length/sample/seed".
//
// The answer is read from what the model generates after the question (greedy, lowest index on
// ties), never by searching the output for the needle's words (the needle contains them too).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "tokenizer.h"

namespace kvh {

extern const char *const kTaskNames[4];  // passkey, niah, niah-multikey, recall

struct TaskPrompt {
    std::string context;   // haystack with the needle block(s): prefilled first
    std::string question;  // the question / cue: prefilled with the context (query-aware) or decoded after it
    std::string answer;    // the expected continuation (greedy-decoded length)
    size_t needle_at = 0;  // byte offset of the asked block in context (token prompts: token index in context_ids)
    std::string needle;    // the asked block as inserted (its bytes unchanged in context)
    std::vector<size_t> distractors_at;  // niah-multikey: the other blocks' offsets (tokens for token prompts)
    // Token prompts (models with a tokenizer, make_task_prompt_tokens): the ids fed to the model;
    // the strings above are then their decoded text. Empty for byte prompts.
    std::vector<int32_t> context_ids;   // BOS (when the model adds one), haystack and blocks
    std::vector<int32_t> question_ids;
    std::vector<int32_t> answer_ids;
    bool tokens() const { return !context_ids.empty(); }
};

// Builds one prompt of exactly `length` bytes (context + question) from the haystack text. Errors:
// unknown task, depth outside [0, 1], a length too short for the question and the needle(s), a text
// too short for the haystack (the message says how long it must be).
bool make_task_prompt(const std::string &task, const std::string &text, int length, double depth, int sample,
                      uint64_t seed, TaskPrompt *p, std::string *err);

// Bytes of haystack text a task needs for prompts of `length` bytes (recall: plus its passage).
size_t task_text_needed(const std::string &task, int length);

// Token prompts for a model with a tokenizer (GGUF files): the same tasks built as text and encoded
// with the model's tokenizer, `length` counted in tokens (BOS included when the model adds one):
// context_ids + question_ids hold exactly `length` ids. The needle, question and answer are the byte
// tasks' strings (same generator, same seeded keys), each encoded on its own without SentencePiece's
// leading space; the haystack is a seeded slice of text_ids (the whole text encoded once,
// task_text_ids) and the blocks sit between its tokens, the asked one starting at token
// round(d * (C - B)) of the C context tokens after BOS (B its tokens). recall takes its passage from
// text_ids: 24 tokens, cued by its first 6, answered by the next 12. Errors as make_task_prompt's,
// counted in tokens (a length must be at least the byte tasks' minimum + 1).
bool make_task_prompt_tokens(const std::string &task, const Tokenizer &tok, const std::vector<int32_t> &text_ids, int length,
                             double depth, int sample, uint64_t seed, TaskPrompt *p, std::string *err);
// The haystack text as ids (no BOS, no leading space).
std::vector<int32_t> task_text_ids(const Tokenizer &tok, const std::string &text);

// The score of a generated answer: exact match and the fraction of positions equal to the answer.
// Token prompts: `generated` is the decoded text of as many greedy tokens as the answer has, cut to
// the answer's byte length before scoring (so a different tokenization of the same text is correct,
// and text after the answer is not judged); the row's `generated` keeps the whole decoded text.
struct TaskScore {
    bool correct = false;
    double byte_accuracy = 0;
};
TaskScore score_answer(const std::string &answer, const std::string &generated);

// One row of a task grid (JSON/CSV, in this order).
struct TaskResult {
    std::string task;
    std::string policy;       // as run: the spec given, plus " compression_ratio=r" when a ratio applies
    std::string spec;         // as applied (compression_ratio resolved against the prompt length)
    double ratio = -1;        // the compression ratio (-1: none, e.g. full KV)
    std::string setting;      // query-aware | query-agnostic
    std::string model, text;  // as given (or the bundled file names)
    uint64_t seed = 0;
    int64_t length = 0;
    double depth = 0;
    int64_t sample = 0;
    std::string answer, generated;
    int correct = 0;
    double byte_accuracy = 0;
    double answer_nll = 0;    // mean NLL (nats/token) of the answer, teacher-forced after the question
    uint64_t live_bytes = 0;  // kvp_stats after the prompt and the answer's tokens but the last
    uint64_t peak_live_bytes = 0;
    uint64_t arena_bytes = 0;
    double kv_ratio = 0;      // live_bytes / f32 K+V bytes of the same tokens in every layer (full KV)
    std::string version;
    double prefill_ms = 0;    // prompt (prefill, and the question's decodes when query-agnostic)
    double decode_ms = 0;     // the answer's teacher-forced decodes
};

extern const char *const kSettings[2];  // query-aware, query-agnostic

// Runs one cell on a session made for the row's spec: fills answer/generated/scores/bytes/times.
class Session;
bool run_task_cell(Session &s, const TaskPrompt &p, bool query_aware, TaskResult *r, std::string *err);

struct TaskGrid {
    std::vector<std::string> tasks;
    std::vector<std::string> specs;    // specs as given (without compression_ratio)
    std::vector<double> ratios;        // applied to every spec whose policy takes one ({} = none)
    std::vector<std::string> settings; // kSettings
    std::vector<int> lengths;
    std::vector<double> depths;
    int samples = 1;
    uint64_t seed = 0;
    int threads = 1;                   // cells run on this many harness threads (results do not depend on it)
    std::string model_name, text_name; // written into the rows
};

// The default policies of `--task` (every policy of the papers, their quantized / ThinK variants).
std::vector<std::string> default_task_specs();
// The specs a grid runs for the --policy specs given: a full-KV baseline first (policy=full with
// capacity = the longest length + 64, room for the answer) unless one of them is policy=full.
std::vector<std::string> task_specs_with_baseline(const Checkpoint &ck, const std::vector<std::string> &given,
                                                  const std::vector<int> &lengths);

// Expands the grid into rows (every field that identifies a cell; no results yet), in output order:
// spec x ratio, setting, length, task, depth, sample. Full KV (and any spec whose policy takes no
// ratio) appears once, with ratio -1, and so does a spec that gives the size a ratio would set
// (window=64 under window/streaming, budget=... under h2o/snapkv/..., capacity under lethe): it runs
// as given. Checks every spec against the model (resolving the ratio for
// each length), every length against the model's context and the text, every depth.
bool expand_task_grid(const Checkpoint &ck, const std::string &text, const TaskGrid &g, std::vector<TaskResult> *rows,
                      std::string *err);

// Runs the rows (as expand_task_grid made them, or as read from a results file): each worker takes
// whole (spec, length) groups and keeps one session per group. progress(done, total) is called
// under a lock. Rows that fail keep correct = 0 and add "row i: message" lines to *err; returns
// false when any failed.
using TaskProgress = std::function<void(size_t, size_t)>;
bool run_task_rows(const Checkpoint &ck, const std::string &text, std::vector<TaskResult> *rows, int threads,
                   std::string *err, const TaskProgress &progress = nullptr);

std::string tasks_to_json(const std::vector<TaskResult> &rs);
std::string tasks_to_csv(const std::vector<TaskResult> &rs);
// True when a results file holds task rows (its first row has a "task" field).
bool is_task_results(const std::string &json_text);
bool parse_task_json(const std::string &text, std::vector<TaskResult> *out, std::string *err);
// Every field but the two times (and version) equal; *diff names the first that is not.
bool same_task_figures(const TaskResult &a, const TaskResult &b, std::string *diff);

// The spec without its compression_ratio (the series of the memory plot and the report's rows).
std::string task_base_spec(const std::string &policy);
// A short label of a spec for tables and plots: policy_family (plot.h), e.g. "snapkv kv_dtype=q4",
// "think token_policy=snapkv" (the keys a compression ratio sets are left out).
std::string task_label(const std::string &policy);

// Summary (markdown): per task, a table of spec rows x (setting, ratio) columns of the accuracy
// (recall: mean byte accuracy) over the cells, with the mean live KV bytes of the cells.
std::string task_report(const std::vector<TaskResult> &rs);

// gnuplot scripts (terminal excluded): the needle heatmap (a panel per spec and ratio, length x
// depth, colour = accuracy) for one task and setting ("both": a panel per setting too), and accuracy against live KV bytes (one line
// per spec, a panel per setting) for one task.
std::string task_heatmap_script(const std::vector<TaskResult> &rs, const std::string &task, const std::string &setting,
                                const std::string &out_path, int *width, int *height);
std::string task_memory_script(const std::vector<TaskResult> &rs, const std::string &task, const std::string &out_path,
                               int *width, int *height);

// Task rows for the llama.cpp port (ports/llama.cpp/tasks.sh: the grid through llama.cpp with
// --kvp, scored here). write_port_rows writes, for each row of an expanded grid, its prompt as
// token ids and the spec as applied, to be run by the port's llama-kvp-tasks:
//   kvprune-task-rows 1
//   <rows>
//   row <i> <query-aware 1|0> <answer tokens> <context tokens> <question tokens> <spec as applied>
//   <context ids, space-separated>
//   <question ids>
// llama-kvp-tasks answers each row with
//   row <i> <live bytes> <peak live bytes> <arena bytes> <tokens seen> <n> <n generated ids>
// after the line "kvprune-task-results 1"; read_port_results (data: that file's text, path: its
// name for messages) fills the rows from it and scores them as run_task_cell does (the answer's
// teacher-forced NLL is not computed through the port: 0; times 0). Errors: a prompt that cannot
// be made, a malformed or missing row.
bool write_port_rows(const Checkpoint &ck, const std::string &text, const std::vector<TaskResult> &rows,
                     const std::string &path, std::string *err);
bool read_port_results(const Checkpoint &ck, const std::string &text, const std::string &data, const std::string &path,
                       std::vector<TaskResult> *rows, std::string *err);

}  // namespace kvh
