#include "tasks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "eval.h"
#include "plot.h"
#include "session.h"
#include "spec.h"

namespace kvh {

const char *const kTaskNames[4] = {"passkey", "niah", "niah-multikey", "recall"};
const char *const kSettings[2] = {"query-aware", "query-agnostic"};

namespace {

// RULER draws its keys from a word list; these are ours (distinct, lower case, common nouns).
const char *const kWords[] = {
    "apple",   "river",  "garden", "candle", "mirror",  "pencil", "tiger",   "harbor",  "violin", "basket",
    "lantern", "meadow", "rocket", "saddle", "thunder", "walnut", "blanket", "compass", "falcon", "glacier",
    "hammer",  "island", "jacket", "kettle", "ladder",  "marble", "needle",  "orchard", "parrot", "quartz",
    "ribbon",  "shadow", "tunnel", "velvet", "window",  "anchor", "bridge",  "castle",  "desert", "engine",
    "feather", "ginger", "helmet", "igloo",  "jungle",  "koala",  "lemon",   "magnet",  "noodle", "oyster",
    "pepper",  "quiver", "raven",  "silver", "teapot",  "umpire", "vessel",  "wizard",  "yogurt", "zipper",
};
constexpr int kWordCount = (int)(sizeof kWords / sizeof kWords[0]);

struct Rng {  // splitmix64
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return n ? next() % n : 0; }  // modulo bias < 2^-40 for our n: irrelevant here
};

uint64_t fnv1a(const std::string &s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return h;
}

bool known_task(const std::string &t) {
    for (const char *n : kTaskNames)
        if (t == n) return true;
    return false;
}

std::string digits(Rng &r, int n) {  // n digits, the first not 0
    std::string s(1, (char)('1' + r.below(9)));
    while ((int)s.size() < n) s += (char)('0' + r.below(10));
    return s;
}

std::string passkey_block(const std::string &key) {
    return " The pass key is " + key + ". Remember it. " + key + " is the pass key. ";
}
std::string niah_block(const std::string &word, const std::string &number) {
    return " One of the special magic numbers for " + word + " is: " + number + ". ";
}
const char *kPasskeyQuestion = " What is the pass key? The pass key is ";
std::string niah_question(const std::string &word) {
    // Byte models: RULER's question, then the cloze form of its answer prefix, ending with the
    // needle's own key phrase so that a model matching context can answer.
    return " What is the special magic number for " + word + " mentioned in the provided text? The special magic number for " +
           word + " is: ";
}
constexpr int kPassage = 64, kCue = 16, kRecallAnswer = 32;

// Largest block and question a task can produce (for the length checks).
size_t max_block(const std::string &task) {
    if (task == "passkey") return passkey_block("00000").size();
    if (task == "recall") return kPassage + 2;
    size_t w = 0;
    for (const char *x : kWords) w = std::max(w, std::strlen(x));
    // multikey: the asked block plus room for three more on either side of it wherever it sits
    return niah_block(std::string(w, 'x'), "0000000").size() * (task == "niah-multikey" ? 6 : 1);
}
size_t max_question(const std::string &task) {
    if (task == "passkey") return std::strlen(kPasskeyQuestion);
    if (task == "recall") return kCue + 1;
    size_t w = 0;
    for (const char *x : kWords) w = std::max(w, std::strlen(x));
    return niah_question(std::string(w, 'x')).size();
}

// The niah needles: blocks[0] is the asked one; sets p->answer and p->question.
void niah_needles(const std::string &task, Rng &rng, std::vector<std::string> *blocks_out, TaskPrompt *p) {
    std::vector<std::string> &blocks = *blocks_out;
    const int n = task == "niah" ? 1 : 4;
    std::vector<int> words;
    std::set<std::string> numbers;
    // Distractors differ from the asked needle in their word's last letter and their number's first
    // digit, so that the last six bytes of the cloze ("d is: ", " is: 4", ...) match the asked needle
    // only: the condition under which a model that matches six bytes of context can answer.
    while ((int)words.size() < n) {
        const int w = (int)rng.below(kWordCount);
        if (std::find(words.begin(), words.end(), w) != words.end()) continue;
        std::string num = digits(rng, 7);
        if (!words.empty() && (std::strlen(kWords[w]) == 0 || kWords[w][std::strlen(kWords[w]) - 1] ==
                                                                  kWords[words[0]][std::strlen(kWords[words[0]]) - 1] ||
                               num[0] == p->answer[0]))
            continue;
        if (!numbers.insert(num).second) continue;
        words.push_back(w);
        blocks.push_back(niah_block(kWords[w], num));
        if (words.size() == 1) p->answer = num;
    }
    p->question = niah_question(kWords[words[0]]);
}

// Block positions in a context of C units (bytes or tokens): the asked one (sizes[0]) at the depth;
// each other one goes to a side of it with room (seeded choice), and the blocks of a side get seeded
// gaps (sorted cut points of its free units).
bool place_blocks(const std::vector<size_t> &sizes, size_t C, double depth, int length, Rng &rng, std::vector<size_t> *at_out,
                  std::string *err) {
    std::vector<size_t> &at = *at_out;
    at.assign(sizes.size(), 0);
    at[0] = (size_t)std::llround(depth * (double)(C - sizes[0]));
    const size_t side_start[2] = {0, at[0] + sizes[0]};
    size_t room[2] = {at[0], C - side_start[1]};
    std::vector<size_t> side[2];
    for (size_t i = 1; i < sizes.size(); i++) {
        const bool fits[2] = {room[0] >= sizes[i], room[1] >= sizes[i]};
        if (!fits[0] && !fits[1]) {
            *err = strprintf("length %d leaves no room for %zu non-overlapping needles", length, sizes.size());
            return false;
        }
        const int sd = fits[0] && fits[1] ? (int)rng.below(2) : (fits[0] ? 0 : 1);
        side[sd].push_back(i);
        room[sd] -= sizes[i];
    }
    for (int sd = 0; sd < 2; sd++) {
        std::vector<size_t> cut(side[sd].size());
        for (size_t &c : cut) c = rng.below(room[sd] + 1);
        std::sort(cut.begin(), cut.end());
        size_t used = 0;
        for (size_t k = 0; k < cut.size(); k++) {
            at[side[sd][k]] = side_start[sd] + cut[k] + used;
            used += sizes[side[sd][k]];
        }
    }
    return true;
}

}  // namespace

size_t task_text_needed(const std::string &task, int length) {
    return (size_t)std::max(length, 0) + (task == "recall" ? (size_t)kPassage : 0);
}

bool make_task_prompt(const std::string &task, const std::string &text, int length, double depth, int sample,
                      uint64_t seed, TaskPrompt *p, std::string *err) {
    if (!known_task(task)) {
        *err = "unknown task '" + task + "' (known: passkey, niah, niah-multikey, recall)";
        return false;
    }
    if (!(depth >= 0 && depth <= 1)) {
        *err = strprintf("depth %g is outside [0, 1]", depth);
        return false;
    }
    const size_t min_len = max_block(task) + max_question(task) + 1;
    if (length < 0 || (size_t)length < min_len) {
        *err = strprintf("length %d is too short for task %s (at least %zu bytes)", length, task.c_str(), min_len);
        return false;
    }
    if (text.size() < task_text_needed(task, length)) {
        *err = strprintf("the text has %zu bytes; task %s at length %d needs at least %zu", text.size(), task.c_str(), length,
                         task_text_needed(task, length));
        return false;
    }
    Rng rng{fnv1a(task + "/" + std::to_string(length) + "/" + std::to_string(sample) + "/" + std::to_string(seed))};
    *p = TaskPrompt();
    std::vector<std::string> blocks;  // [0] is the asked one
    size_t off = SIZE_MAX;            // the haystack's offset in text (recall draws it first)
    if (task == "passkey") {
        const std::string key = digits(rng, 5);
        blocks.push_back(passkey_block(key));
        p->question = kPasskeyQuestion;
        p->answer = key;
    } else if (task == "niah" || task == "niah-multikey") {
        niah_needles(task, rng, &blocks, p);
    } else {  // recall: the passage comes from text outside the haystack's span
        const size_t hay = (size_t)length - (kCue + 1) - (kPassage + 2);
        off = rng.below(text.size() - hay + 1);
        // A passage outside the haystack whose answer is identifiable: every 6-byte context that
        // predicts an answer byte occurs once in the passage and nowhere in the haystack's text (natural
        // text repeats "of the", and a model matching context would then copy from the wrong place:
        // the task is whether the passage was kept, not whether it was ambiguous).
        const std::string run = text.substr(off, hay);
        size_t po = 0;
        bool found = false;
        for (int tries = 0; tries < 4000 && !found; tries++) {
            po = rng.below(text.size() - kPassage + 1);
            found = po + kPassage <= off || po >= off + hay;
            const std::string cand = text.substr(po, kPassage);
            for (int j = 0; found && j < kRecallAnswer; j++) {
                const std::string ctx = cand.substr(kCue - 6 + j, 6);
                found = run.find(ctx) == std::string::npos && cand.find(ctx) == (size_t)(kCue - 6 + j) &&
                        cand.find(ctx, kCue - 5 + j) == std::string::npos;
            }
        }
        const std::string passage = text.substr(po, kPassage);
        blocks.push_back(" " + passage + " ");
        p->question = " " + passage.substr(0, kCue);
        p->answer = passage.substr(kCue, kRecallAnswer);
    }
    const size_t C = (size_t)length - p->question.size();
    size_t total = 0;
    for (const std::string &b : blocks) total += b.size();
    std::vector<size_t> at;
    {
        std::vector<size_t> sizes;
        for (const std::string &b : blocks) sizes.push_back(b.size());
        if (!place_blocks(sizes, C, depth, length, rng, &at, err)) return false;
    }
    // The haystack: C - total bytes of the text from a seeded offset, the blocks placed in order.
    const size_t hay = C - total;
    if (off == SIZE_MAX) off = rng.below(text.size() - hay + 1);
    std::vector<size_t> order(blocks.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });
    std::string ctx;
    ctx.reserve(C);
    size_t h = off;
    for (size_t i : order) {
        const size_t fill = at[i] - ctx.size();
        ctx.append(text, h, fill);
        h += fill;
        ctx += blocks[i];
    }
    ctx.append(text, h, C - ctx.size());
    p->context = ctx;
    p->needle_at = at[0];
    p->needle = blocks[0];
    for (size_t i = 1; i < blocks.size(); i++) p->distractors_at.push_back(at[i]);
    return true;
}

std::vector<int32_t> task_text_ids(const Tokenizer &tok, const std::string &text) { return tok.encode(text, false, false); }

namespace {
constexpr int kPassageT = 24, kCueT = 6, kAnswerT = 12;  // recall in tokens
}  // namespace

bool make_task_prompt_tokens(const std::string &task, const Tokenizer &tok, const std::vector<int32_t> &text_ids, int length,
                             double depth, int sample, uint64_t seed, TaskPrompt *p, std::string *err) {
    if (!known_task(task)) {
        *err = "unknown task '" + task + "' (known: passkey, niah, niah-multikey, recall)";
        return false;
    }
    if (!(depth >= 0 && depth <= 1)) {
        *err = strprintf("depth %g is outside [0, 1]", depth);
        return false;
    }
    const size_t bos = tok.add_bos && tok.bos >= 0 ? 1 : 0;
    // A piece never has more tokens than bytes (a token is at least one byte or one character), so the
    // byte tasks' minimum (+ BOS) leaves room for every block wherever the depth puts it.
    const size_t min_len = max_block(task) + max_question(task) + 1 + bos;
    if (length < 0 || (size_t)length < min_len) {
        *err = strprintf("length %d is too short for task %s (at least %zu tokens)", length, task.c_str(), min_len);
        return false;
    }
    const size_t need = (size_t)length + (task == "recall" ? (size_t)kPassageT : 0);
    if (text_ids.size() < need) {
        *err = strprintf("the text has %zu tokens; task %s at length %d needs at least %zu", text_ids.size(), task.c_str(), length,
                         need);
        return false;
    }
    auto enc = [&](const std::string &t) { return tok.encode(t, false, false); };
    Rng rng{fnv1a(task + "/" + std::to_string(length) + "/" + std::to_string(sample) + "/" + std::to_string(seed))};
    *p = TaskPrompt();
    std::vector<std::vector<int32_t>> blocks;  // [0] is the asked one
    size_t off = SIZE_MAX;                     // the haystack's first token in text_ids (recall draws it first)
    if (task == "passkey" || task == "niah" || task == "niah-multikey") {
        std::vector<std::string> b;
        if (task == "passkey") {
            const std::string key = digits(rng, 5);
            b.push_back(passkey_block(key));
            p->question = kPasskeyQuestion;
            p->answer = key;
        } else {
            niah_needles(task, rng, &b, p);
        }
        for (const std::string &x : b) blocks.push_back(enc(x));
        p->question_ids = enc(p->question);
        p->answer_ids = enc(p->answer);
        p->answer = tok.decode(p->answer_ids);  // what the tokenizer can say (the same text for digits)
    } else {  // recall: a passage of the encoded text outside the haystack's span
        const size_t C0 = (size_t)length - bos - kCueT;
        const size_t hay = C0 - kPassageT;
        off = rng.below(text_ids.size() - hay + 1);
        // As the byte task: every 3-token context that predicts an answer token occurs once in the
        // passage and nowhere in the haystack's tokens (else the first candidate outside the haystack).
        auto tri = [&](size_t at) { return std::make_tuple(text_ids[at], text_ids[at + 1], text_ids[at + 2]); };
        std::set<std::tuple<int32_t, int32_t, int32_t>> run;
        for (size_t i = off; i + 3 <= off + hay; i++) run.insert(tri(i));
        size_t po = 0, first = SIZE_MAX;
        bool found = false;
        for (int tries = 0; tries < 4000 && !found; tries++) {
            po = rng.below(text_ids.size() - kPassageT + 1);
            found = po + kPassageT <= off || po >= off + hay;
            if (found && first == SIZE_MAX) first = po;
            std::set<std::tuple<int32_t, int32_t, int32_t>> seen;
            for (size_t i = po; found && i + 3 <= po + kPassageT; i++) found = seen.insert(tri(i)).second;
            for (int j = 0; found && j < kAnswerT; j++) found = !run.count(tri(po + kCueT - 3 + (size_t)j));
        }
        if (!found) {
            if (first == SIZE_MAX) return *err = "the text leaves no room for a recall passage outside the haystack", false;
            po = first;
        }
        const std::vector<int32_t> passage(text_ids.begin() + (long)po, text_ids.begin() + (long)po + kPassageT);
        blocks.push_back(passage);
        p->question_ids.assign(passage.begin(), passage.begin() + kCueT);
        p->answer_ids.assign(passage.begin() + kCueT, passage.begin() + kCueT + kAnswerT);
        p->question = tok.decode(p->question_ids);
        p->answer = tok.decode(p->answer_ids);
    }
    if (p->question_ids.size() + bos >= (size_t)length) return *err = strprintf("length %d is too short for the question", length), false;
    const size_t C = (size_t)length - bos - p->question_ids.size();
    size_t total = 0;
    std::vector<size_t> sizes;
    for (const auto &b : blocks) {
        total += b.size();
        sizes.push_back(b.size());
    }
    if (total > C) return *err = strprintf("length %d leaves no room for the needles", length), false;
    std::vector<size_t> at;
    if (!place_blocks(sizes, C, depth, length, rng, &at, err)) return false;
    const size_t hay = C - total;
    if (off == SIZE_MAX) off = rng.below(text_ids.size() - hay + 1);
    std::vector<size_t> order(blocks.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });
    std::vector<int32_t> ctx;
    ctx.reserve(C + bos);
    if (bos) ctx.push_back(tok.bos);
    size_t h = off;
    for (size_t i : order) {
        const size_t fill = at[i] + bos - ctx.size();
        ctx.insert(ctx.end(), text_ids.begin() + (long)h, text_ids.begin() + (long)(h + fill));
        h += fill;
        ctx.insert(ctx.end(), blocks[i].begin(), blocks[i].end());
    }
    ctx.insert(ctx.end(), text_ids.begin() + (long)h, text_ids.begin() + (long)(h + C + bos - ctx.size()));
    p->context_ids = ctx;
    p->context = tok.decode(ctx);
    p->needle_at = at[0] + bos;
    p->needle = tok.decode(blocks[0]);
    for (size_t i = 1; i < blocks.size(); i++) p->distractors_at.push_back(at[i] + bos);
    return true;
}

TaskScore score_answer(const std::string &answer, const std::string &generated) {
    TaskScore s;
    size_t same = 0;
    for (size_t i = 0; i < answer.size(); i++) same += i < generated.size() && generated[i] == answer[i];
    s.byte_accuracy = answer.empty() ? 0 : (double)same / (double)answer.size();
    s.correct = !answer.empty() && generated == answer;
    return s;
}

namespace {

std::vector<int32_t> bytes_of(const std::string &s) { return std::vector<int32_t>(s.begin(), s.end()); }

int argmax(const float *lg, int V) {  // lowest index on ties
    int b = 0;
    for (int j = 1; j < V; j++)
        if (lg[j] > lg[b]) b = j;
    return b;
}

double nll_at(const float *lg, int V, int target) {
    double m = lg[0];
    for (int j = 1; j < V; j++) m = std::max(m, (double)lg[j]);
    double z = 0;
    for (int j = 0; j < V; j++) z += std::exp((double)lg[j] - m);
    return std::log(z) + m - (double)lg[target];
}

// Fills a row's answer, text, scores and bytes from the generated ids and the cache's counters
// after the answer. Token prompts: the decoded text cut to the answer's bytes is what is judged (tasks.h).
void score_row(const Tokenizer *tok, const ModelConfig &mc, const TaskPrompt &p, const std::vector<int32_t> &gen_ids,
               const kvp_stats &st, TaskResult *r) {
    std::string gen;
    if (p.tokens()) {
        gen = tok ? tok->decode(gen_ids) : std::string();
    } else {
        for (int32_t t : gen_ids) gen += (char)t;
    }
    const TaskScore sc = score_answer(p.answer, p.tokens() ? gen.substr(0, std::min(gen.size(), p.answer.size())) : gen);
    r->answer = p.answer;
    r->generated = gen;
    r->correct = sc.correct;
    r->byte_accuracy = sc.byte_accuracy;
    r->live_bytes = st.live_bytes;
    r->peak_live_bytes = st.peak_live_bytes;
    r->arena_bytes = st.arena_bytes;
    const double full = 2.0 * 4.0 * (double)mc.kv_dim() * (double)mc.n_layers * (double)st.tokens_seen;
    r->kv_ratio = full > 0 ? (double)st.live_bytes / full : 0;
}

// Feeds the prompt: all of it by prefill (query-aware), or the context by prefill and the
// question by decode (query-agnostic). logits: the prediction of the first answer token.
bool feed_prompt(Session &s, const TaskPrompt &p, bool aware, float *logits, std::string *err) {
    const std::vector<int32_t> c = p.tokens() ? p.context_ids : bytes_of(p.context);
    const std::vector<int32_t> q = p.tokens() ? p.question_ids : bytes_of(p.question);
    if (aware) {
        std::vector<int32_t> t = c;
        t.insert(t.end(), q.begin(), q.end());
        return s.prefill(t.data(), (int)t.size(), logits, false, err);
    }
    if (!s.prefill(c.data(), (int)c.size(), logits, false, err)) return false;
    for (int32_t t : q)
        if (!s.decode(t, logits, err)) return false;
    return true;
}

}  // namespace

bool run_task_cell(Session &s, const TaskPrompt &p, bool aware, TaskResult *r, std::string *err) {
    const int V = s.model().vocab;
    if (V != 256 && !p.tokens()) {
        *err = "task prompts are bytes: the model must be a byte-level model (vocab 256), this one has vocab " +
               std::to_string(V);
        return false;
    }
    std::vector<float> lg((size_t)V);
    using clk = std::chrono::steady_clock;
    if (!s.reset(err)) return false;
    const auto t0 = clk::now();
    if (!feed_prompt(s, p, aware, lg.data(), err)) return false;
    const auto t1 = clk::now();
    // The state after the prompt: a greedy run that leaves the answer restarts here. Under
    // max_prompt the prompt is ended first (its selection runs as at the first decode, which the
    // library makes the same bits), since an open prompt's state is not saved.
    std::vector<char> snap;
    if (!s.end_prompt(err) || !s.snapshot(&snap, err)) return false;
    std::vector<float> lg0 = lg;
    // Teacher-forced pass: the answer's NLL and the greedy choice at every step given the true prefix.
    const std::vector<int32_t> ans = p.tokens() ? p.answer_ids : bytes_of(p.answer);
    double nll = 0;
    bool greedy_is_answer = true;
    for (size_t j = 0; j < ans.size(); j++) {
        nll += nll_at(lg.data(), V, ans[j]);
        greedy_is_answer = greedy_is_answer && argmax(lg.data(), V) == ans[j];
        if (j + 1 < ans.size() && !s.decode(ans[j], lg.data(), err)) return false;
    }
    const auto t2 = clk::now();
    const kvp_stats st = s.stats();
    std::vector<int32_t> gen_ids = ans;
    if (!greedy_is_answer) {
        // Greedy decoding left the answer somewhere: run it free from the state after the prompt
        // (kvp_state_load continues bit for bit as the cache would have; the replays check it).
        gen_ids.clear();
        if (!s.restore(snap, err)) return false;
        lg = lg0;
        for (size_t j = 0; j < ans.size(); j++) {
            const int t = argmax(lg.data(), V);
            gen_ids.push_back(t);
            if (j + 1 < ans.size() && !s.decode(t, lg.data(), err)) return false;
        }
    }
    score_row(s.tokenizer(), s.model(), p, gen_ids, st, r);
    r->answer_nll = ans.empty() ? 0 : nll / (double)ans.size();
    r->version = library_version();
    r->prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    r->decode_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    return true;
}

std::vector<std::string> default_task_specs() {
    return {"policy=window",
            "policy=streaming sinks=4",
            "policy=h2o",
            "policy=snapkv",
            "policy=pyramidkv",
            "policy=lethe",
            "policy=simlayerkv nonlazy=snapkv",
            "policy=asl",
            "policy=think token_policy=snapkv",
            "policy=snapkv kv_dtype=q8",
            "policy=snapkv kv_dtype=q4",
            "policy=random keep_prompt=0"};  // the baseline (issue 32): a uniform random subset at the same memory
}

namespace {

std::string ratio_text(double r) { return strprintf("%.6g", r); }

bool has_key(const std::string &spec, const std::string &key) {
    std::istringstream is(spec);
    std::string t;
    while (is >> t)
        if (t.compare(0, key.size() + 1, key + "=") == 0) return true;
    return false;
}

std::string with_ratio(const std::string &spec, double r) { return spec + " compression_ratio=" + ratio_text(r); }

// Whether a spec's policy takes a compression ratio (all but full).
// The keys compression_ratio sets under a spec's policy (kvprune.h's table; policy=think: those of
// its token policy, where resolve_task_spec sends the ratio).
std::vector<std::string> ratio_size_keys(const kvp_config &c) {
    const kvp_policy p = c.policy == KVP_POLICY_THINK ? c.token_policy : c.policy;
    switch (p) {
        case KVP_POLICY_FULL: return {};
        case KVP_POLICY_WINDOW:
        case KVP_POLICY_STREAMING: return {"window"};
        case KVP_POLICY_LETHE: return {"capacity"};
        case KVP_POLICY_SIMLAYERKV:
            if (c.nonlazy == KVP_POLICY_FULL) return {"window"};
            return {"window", "budget"};
        default: return {"budget"};
    }
}

// A spec takes the grid's ratios unless its policy keeps everything (full) or it gives the size a
// ratio would set (window=64, budget=128, ...): such a spec runs once, as given (issue 29).
bool takes_ratio(const Checkpoint &ck, const std::string &spec, std::string *err) {
    kvp_config c;
    if (!parse_policy(ck.cfg, spec, &c, err)) return false;
    if (c.policy == KVP_POLICY_FULL || (c.policy == KVP_POLICY_THINK && c.token_policy == KVP_POLICY_FULL)) return false;
    for (const std::string &k : ratio_size_keys(c))
        if (has_key(spec, k)) return false;
    return true;
}

}  // namespace

// The prompt of a row: token prompts for a model with a tokenizer (text_ids: task_text_ids), else bytes.
static bool row_prompt(const Checkpoint &ck, const std::string &text, const std::vector<int32_t> &text_ids,
                       const TaskResult &r, TaskPrompt *p, std::string *err) {
    return ck.tok ? make_task_prompt_tokens(r.task, *ck.tok, text_ids, (int)r.length, r.depth, (int)r.sample, r.seed, p, err)
                  : make_task_prompt(r.task, text, (int)r.length, r.depth, (int)r.sample, r.seed, p, err);
}

// A policy as run, resolved for prompts of `length` tokens. compression_ratio means the fraction of
// the prompt's tokens removed for every policy; under ThinK it goes to the token policy's
// budget/window (the library's compression_ratio for policy=think sets the channel ratios instead),
// and ThinK's channel pruning comes on top at its key_channel_ratio, so a ThinK row keeps fewer bytes
// than its ratio says (as kv_dtype rows do): the rows carry the bytes.
static bool resolve_task_spec(const Checkpoint &ck, const std::string &policy, int64_t length, std::string *resolved,
                              std::string *err) {
    kvp_config c;
    std::string e;
    if (has_key(policy, "compression_ratio") && policy.find("policy=think") != std::string::npos) {
        const std::string base = task_base_spec(policy);
        std::string rt;
        std::istringstream is(policy);
        std::string t;
        while (is >> t)
            if (t.compare(0, 18, "compression_ratio=") == 0) rt = t.substr(18);
        kvp_config bc;
        if (!parse_policy(ck.cfg, base, &bc, &e)) return *err = e, false;
        kvp_config tc = bc;
        tc.policy = bc.token_policy;
        char *end = nullptr;
        const double r = std::strtod(rt.c_str(), &end);
        if (rt.empty() || !end || *end || !std::isfinite(r)) return *err = "compression_ratio=" + rt + ": not a number", false;
        const std::string keys = compression_keys(tc, r, length, &e);
        if (keys.empty()) return *err = "bad policy spec '" + policy + "': " + e, false;
        if (!resolve_spec(ck.cfg, base + " " + keys, length, resolved, &c, &e))
            return *err = "bad policy spec '" + policy + "': " + e, false;
        return true;
    }
    if (!resolve_spec(ck.cfg, policy, length, resolved, &c, &e)) return *err = "bad policy spec '" + policy + "': " + e, false;
    return true;
}

bool expand_task_grid(const Checkpoint &ck, const std::string &text, const TaskGrid &g, std::vector<TaskResult> *rows,
                      std::string *err) {
    rows->clear();
    if (g.tasks.empty() || g.lengths.empty() || g.depths.empty() || g.settings.empty() || g.specs.empty() || g.samples < 1)
        return *err = "empty grid (tasks, lengths, depths, settings, policies and samples must be non-empty)", false;
    for (const std::string &t : g.tasks)
        if (!known_task(t)) return *err = "unknown task '" + t + "' (known: passkey, niah, niah-multikey, recall)", false;
    for (double d : g.depths)
        if (!(d >= 0 && d <= 1)) return *err = strprintf("depth %g is outside [0, 1]", d), false;
    for (double r : g.ratios)
        if (!(r >= 0 && r < 1)) return *err = strprintf("compression ratio %g is outside [0, 1)", r), false;
    for (const std::string &s : g.settings)
        if (s != kSettings[0] && s != kSettings[1])
            return *err = "unknown setting '" + s + "' (query-aware or query-agnostic)", false;
    if (ck.cfg.vocab != 256 && !ck.tok)
        return *err = "task prompts are bytes or text: --task needs a byte-level model (vocab 256) or a model with a tokenizer "
                      "(a GGUF file's tokenizer.ggml.*); this one has vocab " +
                      std::to_string(ck.cfg.vocab) + " and no tokenizer",
               false;
    const std::vector<int32_t> text_ids = ck.tok ? task_text_ids(*ck.tok, text) : std::vector<int32_t>();
    for (int L : g.lengths) {
        if (L > ck.cfg.seq_len)
            return *err = strprintf("--lengths: length %d is beyond the model's context (%d tokens); give lengths up to %d",
                                    L, ck.cfg.seq_len, ck.cfg.seq_len),
                   false;
        for (const std::string &t : g.tasks) {
            TaskPrompt p;
            if (ck.tok ? !make_task_prompt_tokens(t, *ck.tok, text_ids, L, g.depths[0], 0, g.seed, &p, err)
                       : !make_task_prompt(t, text, L, g.depths[0], 0, g.seed, &p, err))
                return false;
        }
    }
    // spec x ratio: full (and anything that takes no ratio) once.
    std::vector<std::pair<std::string, double>> runs;
    for (const std::string &s : g.specs) {
        std::string e;
        if (has_key(s, "compression_ratio") || g.ratios.empty()) {
            runs.push_back({s, -1});
            continue;
        }
        const bool tr = takes_ratio(ck, s, &e);
        if (!e.empty()) return *err = e, false;
        if (!tr) {
            runs.push_back({s, -1});
            continue;
        }
        for (double r : g.ratios) runs.push_back({with_ratio(s, r), r});
    }
    for (const auto &run : runs) {
        for (int L : g.lengths) {  // every spec resolves for every length before anything runs
            std::string resolved;
            if (!resolve_task_spec(ck, run.first, L, &resolved, err)) return false;
        }
    }
    for (const auto &run : runs)
        for (const std::string &setting : g.settings)
            for (int L : g.lengths)
                for (const std::string &t : g.tasks)
                    for (double d : g.depths)
                        for (int s = 0; s < g.samples; s++) {
                            TaskResult r;
                            r.task = t;
                            r.policy = run.first;
                            r.ratio = run.second;
                            r.setting = setting;
                            r.model = g.model_name;
                            r.text = g.text_name;
                            r.seed = g.seed;
                            r.length = L;
                            r.depth = d;
                            r.sample = s;
                            rows->push_back(r);
                        }
    return true;
}

bool run_task_rows(const Checkpoint &ck, const std::string &text, std::vector<TaskResult> *rows, int threads,
                   std::string *err, const TaskProgress &progress) {
    // Groups of rows with one (policy, length): one session each, in row order.
    std::vector<std::vector<size_t>> groups;
    std::map<std::pair<std::string, int64_t>, size_t> gi;
    for (size_t i = 0; i < rows->size(); i++) {
        const auto key = std::make_pair((*rows)[i].policy, (*rows)[i].length);
        auto it = gi.find(key);
        if (it == gi.end()) {
            gi[key] = groups.size();
            groups.push_back({i});
        } else {
            groups[it->second].push_back(i);
        }
    }
    // Models with a tokenizer: the text encoded once, token prompts (make_task_prompt_tokens).
    const std::vector<int32_t> text_ids = ck.tok ? task_text_ids(*ck.tok, text) : std::vector<int32_t>();
    std::atomic<size_t> next{0};
    std::mutex mu;
    size_t done = 0;
    std::vector<std::string> errs(rows->size());
    auto worker = [&]() {
        for (;;) {
            const size_t g = next.fetch_add(1);
            if (g >= groups.size()) return;
            const TaskResult &h = (*rows)[groups[g][0]];
            std::string resolved, e;
            Session s;
            const bool ok = resolve_task_spec(ck, h.policy, h.length, &resolved, &e) && s.init(ck, resolved, &e);
            for (size_t i : groups[g]) {
                TaskResult &r = (*rows)[i];
                r.spec = resolved;
                TaskPrompt p;
                std::string re = e;
                const bool made = ok && row_prompt(ck, text, text_ids, r, &p, &re);
                if (made)
                    run_task_cell(s, p, r.setting == kSettings[0], &r, &re);
                errs[i] = re;
                std::lock_guard<std::mutex> lk(mu);
                ++done;
                if (progress) progress(done, rows->size());
            }
        }
    };
    const int T = std::max(1, std::min<int>(threads, (int)groups.size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < T; t++) pool.emplace_back(worker);
    worker();
    for (std::thread &t : pool) t.join();
    std::string all;
    for (size_t i = 0; i < errs.size(); i++)
        if (!errs[i].empty()) all += (all.empty() ? "" : "\n") + strprintf("row %zu ('%s', %s): ", i, (*rows)[i].policy.c_str(),
                                                                        (*rows)[i].task.c_str()) + errs[i];
    if (!all.empty()) {
        *err = all;
        return false;
    }
    return true;
}

std::string tasks_to_json(const std::vector<TaskResult> &rs) {
    std::string o = "[\n";
    for (size_t i = 0; i < rs.size(); i++) {
        const TaskResult &r = rs[i];
        o += "  {\"task\": ";
        json_str(o, r.task);
        o += ", \"policy\": ";
        json_str(o, r.policy);
        o += ", \"spec\": ";
        json_str(o, r.spec);
        o += ", \"ratio\": " + (r.ratio < 0 ? std::string("null") : json_num(r.ratio)) + ", \"setting\": ";
        json_str(o, r.setting);
        o += ", \"model\": ";
        json_str(o, r.model);
        o += ", \"text\": ";
        json_str(o, r.text);
        o += ", \"seed\": " + std::to_string(r.seed) + ", \"length\": " + std::to_string(r.length) +
             ", \"depth\": " + json_num(r.depth) + ", \"sample\": " + std::to_string(r.sample) + ", \"answer\": ";
        json_str(o, r.answer, true);
        o += ", \"generated\": ";
        json_str(o, r.generated, true);
        o += ", \"correct\": " + std::to_string(r.correct) + ", \"byte_accuracy\": " + json_num(r.byte_accuracy) +
             ", \"answer_nll\": " + json_num(r.answer_nll) + ", \"live_bytes\": " + std::to_string(r.live_bytes) +
             ", \"peak_live_bytes\": " + std::to_string(r.peak_live_bytes) +
             ", \"arena_bytes\": " + std::to_string(r.arena_bytes) + ", \"kv_ratio\": " + json_num(r.kv_ratio) +
             ", \"version\": ";
        json_str(o, r.version);
        o += ", \"prefill_ms\": " + json_num(r.prefill_ms, "%.2f") + ", \"decode_ms\": " + json_num(r.decode_ms, "%.2f") + "}";
        o += i + 1 < rs.size() ? ",\n" : "\n";
    }
    return o + "]\n";
}

std::string tasks_to_csv(const std::vector<TaskResult> &rs) {
    std::string o =
        "task,policy,spec,ratio,setting,model,text,seed,length,depth,sample,answer,generated,correct,byte_accuracy,"
        "answer_nll,live_bytes,peak_live_bytes,arena_bytes,kv_ratio,version,prefill_ms,decode_ms\n";
    for (const TaskResult &r : rs) {
        std::string g;  // generated bytes as JSON escapes them (CSV readers choke on raw control bytes)
        json_str(g, r.generated, true);
        o += csv_str(r.task) + "," + csv_str(r.policy) + "," + csv_str(r.spec) + "," +
             (r.ratio < 0 ? std::string("") : json_num(r.ratio)) + "," + csv_str(r.setting) + "," + csv_str(r.model) + "," +
             csv_str(r.text) + "," + std::to_string(r.seed) + "," + std::to_string(r.length) + "," + json_num(r.depth) + "," +
             std::to_string(r.sample) + "," + csv_str(r.answer) + "," + csv_str(g.substr(1, g.size() - 2)) + "," +
             std::to_string(r.correct) + "," + json_num(r.byte_accuracy) + "," + json_num(r.answer_nll) + "," +
             std::to_string(r.live_bytes) + "," + std::to_string(r.peak_live_bytes) + "," + std::to_string(r.arena_bytes) +
             "," + json_num(r.kv_ratio) + "," + csv_str(r.version) + "," + json_num(r.prefill_ms, "%.2f") + "," +
             json_num(r.decode_ms, "%.2f") + "\n";
    }
    return o;
}

bool is_task_results(const std::string &json_text) {
    std::vector<JsonRow> rows;
    std::string e;
    if (!parse_json_rows(json_text, &rows, &e) || rows.empty()) return false;
    for (const auto &kv : rows[0])
        if (kv.first == "task") return true;
    return false;
}

bool parse_task_json(const std::string &text, std::vector<TaskResult> *out, std::string *err) {
    out->clear();
    std::vector<JsonRow> rows;
    if (!parse_json_rows(text, &rows, err)) return false;
    for (size_t ri = 0; ri < rows.size(); ri++) {
        TaskResult r;
        std::set<std::string> seen;
        for (const auto &kv : rows[ri]) {
            const std::string &k = kv.first;
            const JsonField &f = kv.second;
            std::string *str = k == "task" ? &r.task : k == "policy" ? &r.policy : k == "spec" ? &r.spec
                             : k == "setting" ? &r.setting : k == "model" ? &r.model : k == "text" ? &r.text
                             : k == "answer" ? &r.answer : k == "generated" ? &r.generated : k == "version" ? &r.version
                                                                                                            : nullptr;
            double *real = k == "depth" ? &r.depth : k == "byte_accuracy" ? &r.byte_accuracy : k == "answer_nll" ? &r.answer_nll
                         : k == "kv_ratio" ? &r.kv_ratio : k == "prefill_ms" ? &r.prefill_ms : k == "decode_ms" ? &r.decode_ms
                                                                                                            : nullptr;
            uint64_t *u64 = k == "seed" ? &r.seed : k == "live_bytes" ? &r.live_bytes : k == "peak_live_bytes" ? &r.peak_live_bytes
                          : k == "arena_bytes" ? &r.arena_bytes : nullptr;
            uint64_t v = 0;
            if (str) {
                if (!f.is_str) return *err = strprintf("row %zu: field %s must be a string", ri, k.c_str()), false;
                *str = f.text;
            } else if (real) {
                if (!json_field_number(k, f, real, err)) return false;
                if (!std::isfinite(*real)) return *err = strprintf("row %zu: field %s is not finite", ri, k.c_str()), false;
            } else if (u64) {
                if (!json_field_uint(k, f, k == "seed" ? 18446744073709549568.0 : 9007199254740992.0, u64, err)) return false;
            } else if (k == "length" || k == "sample" || k == "correct") {
                if (!json_field_uint(k, f, k == "correct" ? 1.0 : 2147483647.0, &v, err)) return false;
                if (k == "length") r.length = (int64_t)v;
                else if (k == "sample") r.sample = (int64_t)v;
                else r.correct = (int)v;
            } else if (k == "ratio") {
                double d = 0;
                if (!json_field_number(k, f, &d, err)) return false;
                r.ratio = std::isnan(d) ? -1 : d;
                if (!std::isnan(d) && !(d >= 0 && d < 1)) return *err = strprintf("row %zu: ratio %g outside [0, 1)", ri, d), false;
            }
            seen.insert(k);
        }
        for (const char *k : {"task", "policy", "setting", "length", "depth", "sample", "correct"})
            if (!seen.count(k)) return *err = strprintf("row %zu lacks the field %s", ri, k), false;
        out->push_back(r);
    }
    return true;
}

bool same_task_figures(const TaskResult &a, const TaskResult &b, std::string *diff) {
    auto cmp = [&](const char *name, const std::string &x, const std::string &y) {
        if (x == y) return true;
        *diff = std::string(name) + ": " + x + " vs " + y;
        return false;
    };
    auto u = [](uint64_t v) { return std::to_string(v); };
    return cmp("task", a.task, b.task) && cmp("policy", a.policy, b.policy) && cmp("spec", a.spec, b.spec) &&
           cmp("setting", a.setting, b.setting) && cmp("length", u((uint64_t)a.length), u((uint64_t)b.length)) &&
           cmp("depth", json_num(a.depth), json_num(b.depth)) && cmp("sample", u((uint64_t)a.sample), u((uint64_t)b.sample)) &&
           cmp("answer", a.answer, b.answer) && cmp("generated", a.generated, b.generated) &&
           cmp("correct", u((uint64_t)a.correct), u((uint64_t)b.correct)) &&
           cmp("byte_accuracy", json_num(a.byte_accuracy), json_num(b.byte_accuracy)) &&
           cmp("answer_nll", json_num(a.answer_nll), json_num(b.answer_nll)) &&
           cmp("live_bytes", u(a.live_bytes), u(b.live_bytes)) &&
           cmp("peak_live_bytes", u(a.peak_live_bytes), u(b.peak_live_bytes)) &&
           cmp("arena_bytes", u(a.arena_bytes), u(b.arena_bytes)) && cmp("kv_ratio", json_num(a.kv_ratio), json_num(b.kv_ratio));
}

std::string task_base_spec(const std::string &policy) {
    std::istringstream is(policy);
    std::string t, o;
    while (is >> t)
        if (t.compare(0, 18, "compression_ratio=") != 0) o += (o.empty() ? "" : " ") + t;
    return o;
}

std::string task_label(const std::string &policy) { return policy_family(policy); }

namespace {

// Per (label, setting, ratio): cells, accuracy sum, live bytes sum.
struct Agg {
    size_t n = 0;
    double acc = 0, live = 0;
};
double cell_score(const TaskResult &r) { return r.task == "recall" ? r.byte_accuracy : (double)r.correct; }

std::string pct(double r) { return r < 0 ? std::string("full") : strprintf("%g%%", std::round((1 - r) * 1000) / 10); }

// A spec whose policy keeps every token (the full-KV baseline).
bool is_full_spec(const std::string &policy) {
    std::istringstream is(policy);
    std::string t;
    while (is >> t)
        if (t == "policy=full") return true;
    return false;
}

// The row / series / panel a result belongs to: its policy family (task_label), except a spec run
// as given with a size of its own (window=64, no ratio), which is shown whole ("window window=64").
std::string row_label(const TaskResult &r) {
    if (r.ratio >= 0 || is_full_spec(r.policy)) return task_label(r.policy);
    return r.policy.compare(0, 7, "policy=") == 0 ? r.policy.substr(7) : r.policy;
}

}  // namespace

std::vector<std::string> task_specs_with_baseline(const Checkpoint &ck, const std::vector<std::string> &given,
                                                  const std::vector<int> &lengths) {
    for (const std::string &s : given) {
        kvp_config c;
        std::string e;
        if (parse_policy(ck.cfg, s, &c, &e) && c.policy == KVP_POLICY_FULL) return given;
    }
    int longest = 0;
    for (int L : lengths) longest = std::max(longest, L);
    std::vector<std::string> out = {"policy=full capacity=" + std::to_string(longest + 64)};  // the answer's tokens too
    out.insert(out.end(), given.begin(), given.end());
    return out;
}

std::string task_report(const std::vector<TaskResult> &rs) {
    std::vector<std::string> tasks, labels, settings;
    std::set<double> ratio_set;
    for (const TaskResult &r : rs) {
        if (std::find(tasks.begin(), tasks.end(), r.task) == tasks.end()) tasks.push_back(r.task);
        const std::string l = row_label(r);
        if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
        if (std::find(settings.begin(), settings.end(), r.setting) == settings.end()) settings.push_back(r.setting);
        if (r.ratio >= 0) ratio_set.insert(r.ratio);
    }
    std::string o;
    for (const std::string &task : tasks) {
        std::map<std::tuple<std::string, std::string, double>, Agg> agg;
        std::set<int64_t> lens;
        std::set<std::string> full_labels;  // rows of the full-KV baseline
        size_t depths = 0;
        std::set<double> ds;
        for (const TaskResult &r : rs) {
            if (r.task != task) continue;
            Agg &a = agg[std::make_tuple(row_label(r), r.setting, r.ratio)];
            if (r.ratio < 0 && is_full_spec(r.policy)) full_labels.insert(row_label(r));
            a.n++;
            a.acc += cell_score(r);
            a.live += (double)r.live_bytes;
            lens.insert(r.length);
            ds.insert(r.depth);
        }
        depths = ds.size();
        std::vector<std::string> zero_full;  // settings in which full KV answered nothing
        std::string lt;
        for (int64_t l : lens) lt += (lt.empty() ? "" : ", ") + std::to_string(l);
        o += "### " + task + " (" + (task == "recall" ? "mean byte accuracy" : "fraction of cells answered exactly") +
             "; lengths " + lt + ", " + std::to_string(depths) + " depths)\n\n| policy |";
        std::vector<std::pair<std::string, double>> cols;
        for (const std::string &s : settings)
            for (auto it = ratio_set.rbegin(); it != ratio_set.rend(); ++it) cols.push_back({s, *it});
        // Specs run once without a ratio: full KV, and specs with an explicit size (window=64), which
        // get a column of their own ("as given") when there are any.
        bool as_given = false;
        for (const auto &e : agg) as_given = as_given || (std::get<2>(e.first) < 0 && !full_labels.count(std::get<0>(e.first)));
        for (const auto &c : cols) o += " " + c.first + " " + pct(c.second) + " |";
        o += std::string(as_given ? " as given |" : "") + " full KV |\n|---|";
        for (size_t i = 0; i <= cols.size() + (as_given ? 1 : 0); i++) o += "---|";
        o += "\n";
        for (const std::string &l : labels) {
            bool any = false;
            std::string line = "| `" + l + "` |";
            for (const auto &c : cols) {
                auto it = agg.find(std::make_tuple(l, c.first, c.second));
                if (it == agg.end()) {
                    line += " |";
                    continue;
                }
                any = true;
                line += strprintf(" %.2f (%.0f KiB) |", it->second.acc / (double)it->second.n, it->second.live / it->second.n / 1024);
            }
            std::string fullc;
            for (const std::string &s : settings) {
                auto it = agg.find(std::make_tuple(l, s, -1.0));
                if (it == agg.end()) continue;
                any = true;
                fullc += (fullc.empty() ? "" : " / ") +
                         strprintf("%.2f (%.0f KiB)", it->second.acc / (double)it->second.n, it->second.live / it->second.n / 1024);
                if (full_labels.count(l) && it->second.acc == 0)
                    zero_full.push_back(s + ", " + std::to_string(it->second.n) + (it->second.n == 1 ? " cell" : " cells"));
            }
            if (as_given && !full_labels.count(l)) line += " " + fullc + " |" + " |\n";
            else line += std::string(as_given ? " |" : "") + " " + fullc + " |\n";
            if (any) o += line;
        }
        o += "\n";
        if (!zero_full.empty()) {
            std::string w;
            for (const std::string &z : zero_full) w += (w.empty() ? "" : "; ") + z;
            o += "**Warning: full KV scores 0 on " + task + "** (" + w +
                 "): the model cannot do this task at these lengths, so the policies' scores here say nothing about "
                 "pruning (use a model that can, or shorter --lengths).\n\n";
        }
    }
    o += "Cells: (accuracy) (mean live KV KiB after the answer); the full KV column lists the settings in column order.\n";
    return o;
}

namespace {

std::string base_of(const std::string &p) {
    const size_t s = p.find_last_of('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

std::string gp_q(const std::string &s) {
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
    return o + "'";
}

}  // namespace

std::string task_heatmap_script(const std::vector<TaskResult> &rs, const std::string &task, const std::string &setting,
                                const std::string &out_path, int *width, int *height) {
    // Panels: one per policy as run (label x ratio), in file order; full KV first when present.
    std::vector<std::string> panels;
    std::set<int64_t> lens;
    std::set<double> depths;
    std::map<std::string, std::map<std::pair<int64_t, double>, Agg>> cells;
    std::string model;
    for (const TaskResult &r : rs) {
        const bool both = setting == "both";  // a panel per setting too
        if (r.task != task || (!both && r.setting != setting)) continue;
        const std::string name =
            row_label(r) + (r.ratio >= 0 ? " @" + pct(r.ratio) : is_full_spec(r.policy) ? std::string(" (full)") : std::string()) +
            (both ? ", " + r.setting : std::string());
        if (!cells.count(name)) panels.push_back(name);
        Agg &a = cells[name][{r.length, r.depth}];
        a.n++;
        a.acc += cell_score(r);
        lens.insert(r.length);
        depths.insert(r.depth);
        model = base_of(r.model);
    }
    const int cols = std::min<int>(4, std::max<int>(1, (int)panels.size()));
    const int prow = ((int)panels.size() + cols - 1) / cols;
    *width = 320 * cols + 60;
    *height = 260 * std::max(1, prow) + 80;
    std::string s;
    if (!out_path.empty()) s += "set output " + gp_q(out_path) + "\n";
    if (panels.empty()) return s + "set title " + gp_q("no rows for task " + task + ", " + setting) + "\nplot NaN notitle\n";
    std::vector<int64_t> L(lens.begin(), lens.end());
    std::vector<double> D(depths.begin(), depths.end());
    s += "set multiplot layout " + std::to_string(prow) + "," + std::to_string(cols) + " title " +
         gp_q("kvprune " + task + ", " + setting + ": accuracy by prompt length and needle depth (model " + model + ")") +
         " noenhanced\n";
    s += "set palette defined (0 '#b2182b', 0.5 '#fddbc7', 1 '#1a9850')\nset cbrange [0:1]\nset xrange [-0.5:" +
         std::to_string(L.size() - 0.5) + "]\nset yrange [" + std::to_string(D.size() - 0.5) + ":-0.5]\nset xtics (";
    for (size_t i = 0; i < L.size(); i++) s += (i ? ", " : "") + strprintf("'%lld' %zu", (long long)L[i], i);
    s += ")\nset ytics (";
    for (size_t i = 0; i < D.size(); i++) s += (i ? ", " : "") + strprintf("'%g' %zu", D[i], i);
    s += ")\nset xlabel 'length' offset 0,0.5\nset ylabel 'depth' offset 1,0\nunset key\nset tics font ',8'\n";
    for (size_t p = 0; p < panels.size(); p++) {
        s += "set title " + gp_q(panels[p]) + " noenhanced font ',9'\n";
        s += (p + 1 == panels.size() ? "set colorbox\n" : "unset colorbox\n");
        s += "$h" + std::to_string(p) + " << EOD\n";
        for (size_t i = 0; i < L.size(); i++)
            for (size_t j = 0; j < D.size(); j++) {
                auto it = cells[panels[p]].find({L[i], D[j]});
                if (it == cells[panels[p]].end()) continue;
                s += strprintf("%zu %zu %.6g\n", i, j, it->second.acc / (double)it->second.n);
            }
        s += "EOD\nplot $h" + std::to_string(p) + " using 1:2:(0.5):(0.5):3 with boxxyerror fc palette fs solid 1.0 noborder\n";
    }
    return s + "unset multiplot\n";
}

std::string task_memory_script(const std::vector<TaskResult> &rs, const std::string &task, const std::string &out_path,
                               int *width, int *height) {
    static const int kPointTypes[8] = {7, 6, 5, 4, 9, 8, 13, 12};
    std::vector<std::string> settings, labels;
    std::map<std::string, std::map<std::string, std::map<double, Agg>>> pts;  // setting -> label -> ratio
    std::string model;
    for (const TaskResult &r : rs) {
        if (r.task != task) continue;
        if (std::find(settings.begin(), settings.end(), r.setting) == settings.end()) settings.push_back(r.setting);
        const std::string l = row_label(r);
        if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
        Agg &a = pts[r.setting][l][r.ratio];
        a.n++;
        a.acc += cell_score(r);
        a.live += (double)r.live_bytes;
        model = base_of(r.model);
    }
    // A panel per setting, one above the other, each with its legend at its right in a readable font
    // (issue 29: a legend below the panels in 8 pt crowded the x-axis label); the panel grows with
    // the number of series so that the legend fits beside it.
    const int per_panel = std::max(480, 60 + 22 * (int)labels.size());
    *width = 1200;
    *height = per_panel * std::max<int>(1, (int)settings.size()) + 50;
    std::string s;
    if (!out_path.empty()) s += "set output " + gp_q(out_path) + "\n";
    if (settings.empty()) return s + "set title " + gp_q("no rows for task " + task) + "\nplot NaN notitle\n";
    s += "set multiplot layout " + std::to_string(settings.size()) + ",1 title " +
         gp_q("kvprune " + task + ": accuracy against live KV bytes (model " + model + ")") + " noenhanced font ',13'\n";
    s += "set logscale x 2\nset format x '%.0b %BB'\nset yrange [-0.05:1.05]\nset grid\n"
         "set key outside right top vertical Left reverse noenhanced font ',11' spacing 1.15 samplen 3 width 1\n"
         "set tics font ',11'\nset xlabel 'mean live KV bytes' font ',12' offset 0,0.3\nset ylabel '" +
         std::string(task == "recall" ? "mean byte accuracy" : "accuracy") + "' font ',12'\n";
    for (const std::string &setting : settings) {
        s += "set title " + gp_q(setting) + " font ',12'\n";
        std::string plot = "plot ";
        int k = 0;
        for (size_t i = 0; i < labels.size(); i++) {
            auto it = pts[setting].find(labels[i]);
            if (it == pts[setting].end()) continue;
            std::vector<std::pair<double, double>> xy;
            for (const auto &rp : it->second) xy.push_back({rp.second.live / rp.second.n, rp.second.acc / rp.second.n});
            std::sort(xy.begin(), xy.end());
            const std::string d = "$m" + std::to_string(&setting - &settings[0]) + "_" + std::to_string(i);
            s += d + " << EOD\n";
            for (const auto &p : xy) s += strprintf("%.9g %.6g\n", p.first, p.second);
            s += "EOD\n";
            plot += (k ? ", \\\n     " : "") + d + " using 1:2 with linespoints lw 2 dt " + std::to_string(k % 5 + 1) + " pt " +
                    std::to_string(kPointTypes[(i + i / 8) % 8]) + " ps 1.4 title " + gp_q(labels[i]);
            k++;
        }
        s += plot + "\n";
    }
    return s + "unset multiplot\n";
}

// ---------------------------------------------------------------- the grid through llama.cpp
// (ports/llama.cpp/tasks.sh; tasks.h "Task rows for the llama.cpp port")

namespace {

void put_ids(std::string *o, const std::vector<int32_t> &ids) {
    for (size_t i = 0; i < ids.size(); i++) *o += (i ? " " : "") + std::to_string(ids[i]);
    *o += '\n';
}

}  // namespace

bool write_port_rows(const Checkpoint &ck, const std::string &text, const std::vector<TaskResult> &rows,
                     const std::string &path, std::string *err) {
    const std::vector<int32_t> text_ids = ck.tok ? task_text_ids(*ck.tok, text) : std::vector<int32_t>();
    std::string o = "kvprune-task-rows 1\n" + std::to_string(rows.size()) + "\n";
    for (size_t i = 0; i < rows.size(); i++) {
        const TaskResult &r = rows[i];
        TaskPrompt p;
        std::string e, spec;
        if (!row_prompt(ck, text, text_ids, r, &p, &e) || !resolve_task_spec(ck, r.policy, r.length, &spec, &e))
            return *err = "row " + std::to_string(i) + ": " + e, false;
        const std::vector<int32_t> c = p.tokens() ? p.context_ids : bytes_of(p.context);
        const std::vector<int32_t> q = p.tokens() ? p.question_ids : bytes_of(p.question);
        const size_t na = p.tokens() ? p.answer_ids.size() : p.answer.size();
        o += "row " + std::to_string(i) + " " + (r.setting == kSettings[0] ? "1" : "0") + " " + std::to_string(na) + " " +
             std::to_string(c.size()) + " " + std::to_string(q.size()) + " " + spec + "\n";
        put_ids(&o, c);
        put_ids(&o, q);
    }
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return *err = "cannot write " + path, false;
    const bool ok = std::fwrite(o.data(), 1, o.size(), f) == o.size();
    return (std::fclose(f) == 0 && ok) || (*err = "cannot write " + path, false);
}

bool read_port_results(const Checkpoint &ck, const std::string &text, const std::string &data, const std::string &path,
                       std::vector<TaskResult> *rows, std::string *err) {
    std::istringstream in(data);
    std::string head;
    int version = 0;
    if (!(in >> head >> version) || head != "kvprune-task-results" || version != 1)
        return *err = path + ": not a task results file of the port (first line 'kvprune-task-results 1')", false;
    const std::vector<int32_t> text_ids = ck.tok ? task_text_ids(*ck.tok, text) : std::vector<int32_t>();
    std::vector<bool> seen(rows->size(), false);
    std::string word;
    while (in >> word) {
        unsigned long long i = 0, live = 0, peak = 0, arena = 0, tokens = 0, n = 0;
        if (word != "row" || !(in >> i >> live >> peak >> arena >> tokens >> n) || i >= rows->size() || seen[i] || n > 1000000)
            return *err = path + ": a malformed or repeated row line, or a row the grid does not have", false;
        std::vector<int32_t> gen(n);
        for (auto &t : gen)
            if (!(in >> t)) return *err = path + ": row " + std::to_string(i) + " has fewer ids than it says", false;
        TaskResult &r = (*rows)[i];
        TaskPrompt p;
        std::string e;
        if (!row_prompt(ck, text, text_ids, r, &p, &e) || !resolve_task_spec(ck, r.policy, r.length, &r.spec, &e))
            return *err = "row " + std::to_string(i) + ": " + e, false;
        kvp_stats st = {};
        st.live_bytes = live;
        st.peak_live_bytes = peak;
        st.arena_bytes = arena;
        st.tokens_seen = tokens;
        score_row(ck.tok.get(), ck.cfg, p, gen, st, &r);  // as run_task_cell scores
        r.answer_nll = 0;  // not computed through the port (no teacher-forced pass)
        r.version = std::string(library_version()) + " llama.cpp port";
        seen[i] = true;
    }
    for (size_t i = 0; i < seen.size(); i++)
        if (!seen[i]) return *err = path + ": row " + std::to_string(i) + " of the grid has no result", false;
    return true;
}

}  // namespace kvh
