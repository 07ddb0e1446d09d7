// Tests of the retrieval tasks (bench/harness/tasks.h): prompt construction (exact length, the
// needle at its depth with its bytes unchanged, the haystack taken from the text in order), the
// scorers on hand-made outputs, the results file round trip, bad input, and cells on the bundled
// retrieval model (induction6.bin) that must succeed and cells that must fail.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "eval.h"
#include "session.h"
#include "tasks.h"

using namespace kvh;

namespace {

const std::string kDir = KVP_HARNESS_MODELS_DIR;

const std::string &eval_text() {
    static std::string t;
    if (t.empty()) {
        std::ifstream f(kDir + "/enbytes-1m.eval.txt", std::ios::binary);
        t.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    }
    return t;
}

const std::vector<std::string> kTasks = {"passkey", "niah", "niah-multikey", "recall"};

// The context with every block cut out must be one contiguous run of the text.
void expect_haystack_from_text(const TaskPrompt &p, const std::string &text) {
    std::vector<std::pair<size_t, size_t>> cuts = {{p.needle_at, p.needle.size()}};
    for (size_t d : p.distractors_at) cuts.push_back({d, p.context.find(". ", d + 1) + 2 - d});  // " One of ... NNNNNNN. "
    std::sort(cuts.begin(), cuts.end());
    std::string hay;
    size_t at = 0;
    for (const auto &c : cuts) {
        ASSERT_LE(at, c.first) << "blocks overlap";
        hay += p.context.substr(at, c.first - at);
        at = c.first + c.second;
    }
    hay += p.context.substr(at);
    EXPECT_NE(text.find(hay), std::string::npos) << "the haystack is not a run of the text";
}

}  // namespace

TEST(Tasks, PromptLengthExactAndNeedleAtDepth) {
    const std::string &text = eval_text();
    ASSERT_GT(text.size(), 100000u);
    for (const std::string &task : kTasks)
        for (int L : {500, 512, 1000})
            for (int di = 0; di <= 10; di++)
                for (int s = 0; s < 2; s++) {
                    const double d = di / 10.0;
                    TaskPrompt p;
                    std::string err;
                    ASSERT_TRUE(make_task_prompt(task, text, L, d, s, 7, &p, &err)) << task << " " << L << ": " << err;
                    const std::string prompt = p.context + p.question;
                    EXPECT_EQ(prompt.size(), (size_t)L) << task;
                    const size_t C = p.context.size();
                    EXPECT_EQ(p.needle_at, (size_t)std::llround(d * (double)(C - p.needle.size()))) << task << " depth " << d;
                    EXPECT_EQ(p.context.substr(p.needle_at, p.needle.size()), p.needle);
                    if (task == "recall") {
                        // the passage's first 16 bytes end the prompt; its next 32 are the answer
                        EXPECT_EQ(p.needle.substr(1, 16), p.question.substr(1));
                        EXPECT_EQ(p.needle.substr(17, 32), p.answer);
                    } else {
                        EXPECT_NE(p.needle.find(p.answer), std::string::npos) << "the needle holds the answer";
                        EXPECT_EQ(p.answer.size(), task == "passkey" ? 5u : 7u);
                    }
                    if (task == "niah-multikey") {
                        EXPECT_EQ(p.distractors_at.size(), 3u);
                    } else {
                        EXPECT_TRUE(p.distractors_at.empty());
                    }
                    expect_haystack_from_text(p, text);
                }
}

TEST(Tasks, DepthEndsAndSharedHaystack) {
    const std::string &text = eval_text();
    TaskPrompt a, b, c, other;
    std::string err;
    ASSERT_TRUE(make_task_prompt("passkey", text, 512, 0.0, 3, 1, &a, &err)) << err;
    ASSERT_TRUE(make_task_prompt("passkey", text, 512, 1.0, 3, 1, &b, &err)) << err;
    ASSERT_TRUE(make_task_prompt("passkey", text, 512, 0.5, 3, 1, &c, &err)) << err;
    ASSERT_TRUE(make_task_prompt("passkey", text, 512, 0.5, 4, 1, &other, &err)) << err;
    EXPECT_EQ(a.needle_at, 0u);
    EXPECT_EQ(b.needle_at + b.needle.size(), b.context.size()) << "depth 1: the needle right before the question";
    EXPECT_EQ(a.answer, b.answer) << "the key does not depend on the depth";
    EXPECT_EQ(a.answer, c.answer);
    EXPECT_NE(a.answer, other.answer) << "another sample, another key";
    // The same haystack bytes around the needle whatever the depth.
    EXPECT_EQ(a.context.substr(a.needle.size()), b.context.substr(0, b.needle_at));
    // Same inputs, same prompt.
    TaskPrompt again;
    ASSERT_TRUE(make_task_prompt("passkey", text, 512, 0.5, 3, 1, &again, &err));
    EXPECT_EQ(again.context, c.context);
    EXPECT_EQ(again.question, c.question);
    // Another seed, another prompt.
    ASSERT_TRUE(make_task_prompt("passkey", text, 512, 0.5, 3, 2, &again, &err));
    EXPECT_NE(again.context, c.context);
}

TEST(Tasks, NeedleTexts) {
    const std::string &text = eval_text();
    TaskPrompt p;
    std::string err;
    ASSERT_TRUE(make_task_prompt("passkey", text, 300, 0.3, 0, 0, &p, &err));
    EXPECT_EQ(p.needle, " The pass key is " + p.answer + ". Remember it. " + p.answer + " is the pass key. ");
    EXPECT_EQ(p.question, " What is the pass key? The pass key is ");
    ASSERT_TRUE(make_task_prompt("niah", text, 400, 0.3, 0, 0, &p, &err));
    const size_t w0 = p.needle.find(" for ") + 5, w1 = p.needle.find(" is: ");
    const std::string word = p.needle.substr(w0, w1 - w0);
    EXPECT_EQ(p.needle, " One of the special magic numbers for " + word + " is: " + p.answer + ". ");
    EXPECT_EQ(p.question, " What is the special magic number for " + word +
                              " mentioned in the provided text? The special magic number for " + word + " is: ");
    ASSERT_TRUE(make_task_prompt("niah-multikey", text, 700, 0.3, 0, 0, &p, &err));
    std::set<std::string> words;
    for (size_t d : p.distractors_at) {
        const size_t a = p.context.find(" for ", d) + 5, b = p.context.find(" is: ", d);
        words.insert(p.context.substr(a, b - a));
        EXPECT_EQ(p.context.compare(d, 38, " One of the special magic numbers for "), 0);
    }
    EXPECT_EQ(words.size(), 3u);
    EXPECT_FALSE(words.count(p.needle.substr(p.needle.find(" for ") + 5, p.needle.find(" is: ") - p.needle.find(" for ") - 5)));
}

TEST(Tasks, BadInput) {
    const std::string &text = eval_text();
    TaskPrompt p;
    std::string err;
    EXPECT_FALSE(make_task_prompt("passkeys", text, 512, 0.5, 0, 0, &p, &err));
    EXPECT_NE(err.find("unknown task 'passkeys'"), std::string::npos) << err;
    for (double d : {-0.1, 1.1, (double)NAN}) {
        EXPECT_FALSE(make_task_prompt("passkey", text, 512, d, 0, 0, &p, &err));
        EXPECT_NE(err.find("outside [0, 1]"), std::string::npos) << err;
    }
    EXPECT_FALSE(make_task_prompt("passkey", text, 60, 0.5, 0, 0, &p, &err));
    EXPECT_NE(err.find("too short for task passkey"), std::string::npos) << err;
    EXPECT_FALSE(make_task_prompt("niah-multikey", text, 300, 0.5, 0, 0, &p, &err));
    EXPECT_NE(err.find("too short"), std::string::npos) << err;
    const std::string small = text.substr(0, 400);
    EXPECT_FALSE(make_task_prompt("passkey", small, 512, 0.5, 0, 0, &p, &err));
    EXPECT_NE(err.find("the text has 400 bytes; task passkey at length 512 needs at least 512"), std::string::npos) << err;
    EXPECT_FALSE(make_task_prompt("recall", text.substr(0, 520), 512, 0.5, 0, 0, &p, &err));
    EXPECT_NE(err.find("needs at least 576"), std::string::npos) << err;
}

TEST(Tasks, Scorers) {
    TaskScore s = score_answer("48917", "48917");
    EXPECT_TRUE(s.correct);
    EXPECT_DOUBLE_EQ(s.byte_accuracy, 1.0);
    s = score_answer("48917", "48817");
    EXPECT_FALSE(s.correct);
    EXPECT_DOUBLE_EQ(s.byte_accuracy, 0.8);
    s = score_answer("48917", "");
    EXPECT_FALSE(s.correct);
    EXPECT_DOUBLE_EQ(s.byte_accuracy, 0.0);
    s = score_answer("48917", "489");  // short: the missing positions count as wrong
    EXPECT_FALSE(s.correct);
    EXPECT_DOUBLE_EQ(s.byte_accuracy, 0.6);
    s = score_answer("48917", "48917 is");  // longer is not exact
    EXPECT_FALSE(s.correct);
    EXPECT_DOUBLE_EQ(s.byte_accuracy, 1.0);
    s = score_answer("", "");
    EXPECT_FALSE(s.correct);
}

TEST(Tasks, ResultsRoundTrip) {
    TaskResult r;
    r.task = "recall";
    r.policy = "policy=snapkv compression_ratio=0.75";
    r.spec = "policy=snapkv budget=128";
    r.ratio = 0.75;
    r.setting = kSettings[1];
    r.model = "induction6.bin";
    r.text = "enbytes-1m.eval.txt";
    r.seed = 18446744073709549568ull;
    r.length = 512;
    r.depth = 0.3;
    r.sample = 2;
    r.answer = "abc\"\\\n";
    r.generated = std::string("a\x01\x7f\x80\xff\"", 6);
    r.correct = 1;
    r.byte_accuracy = 0.25;
    r.answer_nll = 1.234567891;
    r.live_bytes = 123456;
    r.peak_live_bytes = 234567;
    r.arena_bytes = 345678;
    r.kv_ratio = 0.2501;
    r.version = "0.2.0";
    TaskResult full = r;
    full.ratio = -1;
    full.correct = 0;
    const std::string j = tasks_to_json({r, full});
    EXPECT_TRUE(is_task_results(j));
    EXPECT_FALSE(is_task_results("[{\"policy\": \"x\", \"nll\": 1, \"live_bytes\": 2}]"));
    std::vector<TaskResult> back;
    std::string err, diff;
    ASSERT_TRUE(parse_task_json(j, &back, &err)) << err;
    ASSERT_EQ(back.size(), 2u);
    EXPECT_TRUE(same_task_figures(r, back[0], &diff)) << diff;
    EXPECT_TRUE(same_task_figures(full, back[1], &diff)) << diff;
    EXPECT_EQ(back[0].generated, r.generated);
    EXPECT_EQ(back[0].seed, r.seed);
    EXPECT_EQ(back[1].ratio, -1);
    back[0].generated[0] = 'b';
    EXPECT_FALSE(same_task_figures(r, back[0], &diff));
    EXPECT_EQ(diff.compare(0, 9, "generated"), 0) << diff;
    // Malformed rows: a clear message.
    EXPECT_FALSE(parse_task_json("[{\"task\": \"passkey\"}]", &back, &err));
    EXPECT_NE(err.find("lacks the field policy"), std::string::npos) << err;
    EXPECT_FALSE(parse_task_json("[{\"task\": \"passkey\", \"policy\": \"p\", \"setting\": \"s\", \"length\": -1}]", &back, &err));
    EXPECT_NE(err.find("field length"), std::string::npos) << err;
    EXPECT_FALSE(parse_task_json("[{\"task\": 3}]", &back, &err));
    EXPECT_NE(err.find("must be a string"), std::string::npos) << err;
    // CSV: a header and one line per row, the generated bytes escaped.
    const std::string csv = tasks_to_csv({r});
    EXPECT_EQ(csv.compare(0, 18, "task,policy,spec,r"), 0);
    EXPECT_NE(csv.find("\\u0001\\u007f\\u0080\\u00ff"), std::string::npos) << csv;
}

TEST(Tasks, Labels) {
    EXPECT_EQ(task_base_spec("policy=snapkv obs_window=16 compression_ratio=0.75"), "policy=snapkv obs_window=16");
    EXPECT_EQ(task_label("policy=snapkv kv_dtype=q4 compression_ratio=0.5"), "snapkv kv_dtype=q4");
    EXPECT_EQ(task_label("policy=snapkv budget=128"), "snapkv");
    EXPECT_EQ(task_label("policy=think token_policy=snapkv key_channel_ratio=0.5"), "think token_policy=snapkv");
    EXPECT_EQ(task_label("policy=full capacity=1088"), "full");
    EXPECT_NE(task_label("policy=snapkv kv_dtype=q8"), task_label("policy=snapkv kv_dtype=q4"));
}

class TaskModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        std::string err;
        ck_ = new Checkpoint;
        ASSERT_TRUE(load_checkpoint(kDir + "/induction6.bin", ck_, &err)) << err;
    }
    static void TearDownTestSuite() {
        delete ck_;
        ck_ = nullptr;
    }
    // passkey at 256 bytes, depths 0 and 1, both settings: full KV and window at ratio 0.5 (8 rows)
    static TaskGrid small_grid() {
        TaskGrid g;
        g.tasks = {"passkey"};
        g.specs = {"policy=full capacity=400", "policy=window"};
        g.ratios = {0.5};
        g.settings = {kSettings[0], kSettings[1]};
        g.lengths = {256};
        g.depths = {0.0, 1.0};
        return g;
    }
    static Checkpoint *ck_;
};
Checkpoint *TaskModel::ck_ = nullptr;

// Full KV answers; a window too small to hold the needle does not; both settings agree for full KV.
TEST_F(TaskModel, CellsFullKvAnswersWindowDoesNot) {
    const std::string &text = eval_text();
    Session full, win;
    std::string err;
    ASSERT_TRUE(full.init(*ck_, "policy=full capacity=400", &err)) << err;
    ASSERT_TRUE(win.init(*ck_, "policy=window window=48", &err)) << err;
    for (double d : {0.0, 0.5}) {
        TaskPrompt p;
        ASSERT_TRUE(make_task_prompt("passkey", text, 300, d, 0, 0, &p, &err)) << err;
        TaskResult a, g, w;
        ASSERT_TRUE(run_task_cell(full, p, true, &a, &err)) << err;
        ASSERT_TRUE(run_task_cell(full, p, false, &g, &err)) << err;
        ASSERT_TRUE(run_task_cell(win, p, true, &w, &err)) << err;
        EXPECT_EQ(a.generated, p.answer) << "depth " << d;
        EXPECT_EQ(a.correct, 1);
        EXPECT_EQ(g.generated, p.answer) << "full KV: query-agnostic answers too";
        EXPECT_EQ(w.correct, 0) << "a 48-token window cannot hold a needle at depth " << d << ": " << w.generated;
        EXPECT_EQ(w.generated.size(), p.answer.size());
        EXPECT_LT(a.answer_nll, 0.5) << "the answer is predicted with confidence";
        EXPECT_GT(w.answer_nll, a.answer_nll);
        EXPECT_LT(w.live_bytes, a.live_bytes);
        EXPECT_GT(a.kv_ratio, 0.99);
        EXPECT_LT(w.kv_ratio, 0.2);
    }
}

// A cache with max_prompt holds the prompt open until its selection; a cell ends it before saving
// the state after the prompt (kvp_state_save refuses an open prompt; the cell used to fail). The
// selection at kvp_prompt_end is the one the first decode would run, and snapkv takes this prompt
// in one call either way: so the rows equal the rows without max_prompt, right and wrong answers
// (the latter restart from the saved state) alike.
TEST_F(TaskModel, MaxPromptCellsEqualOneCall) {
    const std::string &text = eval_text();
    Session open, plain;
    std::string err;
    ASSERT_TRUE(open.init(*ck_, "policy=snapkv budget=64 max_prompt=512", &err)) << err;
    ASSERT_TRUE(plain.init(*ck_, "policy=snapkv budget=64", &err)) << err;
    int right = 0, cells = 0;
    for (double d : {0.0, 0.5, 1.0})
        for (bool aware : {true, false}) {
            TaskPrompt p;
            ASSERT_TRUE(make_task_prompt("passkey", text, 300, d, 0, 0, &p, &err)) << err;
            TaskResult a, b;
            ASSERT_TRUE(run_task_cell(open, p, aware, &a, &err)) << err;
            ASSERT_TRUE(run_task_cell(plain, p, aware, &b, &err)) << err;
            EXPECT_EQ(a.generated, b.generated) << "depth " << d << " aware " << aware;
            EXPECT_EQ(a.live_bytes, b.live_bytes);
            EXPECT_EQ(a.answer_nll, b.answer_nll);
            right += a.correct;
            ++cells;
        }
    EXPECT_GT(right, 0);
    EXPECT_LT(right, cells) << "a wrong answer exercises the restart from the saved state";
    Session lethe;
    ASSERT_TRUE(lethe.init(*ck_, "policy=lethe capacity=128 max_prompt=512", &err)) << err;
    TaskPrompt p;
    ASSERT_TRUE(make_task_prompt("passkey", text, 300, 0.5, 0, 0, &p, &err)) << err;
    TaskResult r;
    EXPECT_TRUE(run_task_cell(lethe, p, true, &r, &err)) << err;
    EXPECT_EQ(r.generated.size(), p.answer.size());
}

TEST_F(TaskModel, RecallFullKv) {
    const std::string &text = eval_text();
    Session full;
    std::string err;
    ASSERT_TRUE(full.init(*ck_, "policy=full capacity=500", &err)) << err;
    double acc = 0;
    for (int s = 0; s < 8; s++) {  // the first 8 samples at length 400, depth 0.5 (issue 19: >= 0.75 with full KV)
        TaskPrompt p;
        ASSERT_TRUE(make_task_prompt("recall", text, 400, 0.5, s, 0, &p, &err)) << err;
        TaskResult r;
        ASSERT_TRUE(run_task_cell(full, p, true, &r, &err)) << err;
        EXPECT_EQ(r.answer, p.answer);
        acc += r.byte_accuracy;
    }
    EXPECT_GE(acc / 8, 0.75);
}

// The grid: bad input refused before anything runs; rows identical for 1 and 2 threads.
TEST_F(TaskModel, GridChecksAndThreads) {
    const std::string &text = eval_text();
    TaskGrid g = small_grid();
    std::vector<TaskResult> rows;
    std::string err;
    ASSERT_TRUE(expand_task_grid(*ck_, text, g, &rows, &err)) << err;
    ASSERT_EQ(rows.size(), 8u);  // (full once + window at 0.5) x 2 settings x 2 depths
    EXPECT_EQ(rows[0].ratio, -1);
    EXPECT_EQ(rows[4].policy, "policy=window compression_ratio=0.5");
    std::vector<TaskResult> one = rows, two = rows;
    ASSERT_TRUE(run_task_rows(*ck_, text, &one, 1, &err)) << err;
    ASSERT_TRUE(run_task_rows(*ck_, text, &two, 2, &err)) << err;
    for (size_t i = 0; i < rows.size(); i++) {
        std::string diff;
        EXPECT_TRUE(same_task_figures(one[i], two[i], &diff)) << i << ": " << diff;
    }
    EXPECT_EQ(one[4].spec, "policy=window window=128");
    EXPECT_EQ(one[0].correct + one[1].correct, 2) << "full KV answers at both depths";

    TaskGrid b = g;
    b.lengths = {2000};
    EXPECT_FALSE(expand_task_grid(*ck_, text, b, &rows, &err));
    EXPECT_NE(err.find("--lengths: length 2000 is beyond the model's context (1024 tokens); give lengths up to 1024"),
              std::string::npos)
        << err;
    b = g;
    b.depths = {1.5};
    EXPECT_FALSE(expand_task_grid(*ck_, text, b, &rows, &err));
    EXPECT_NE(err.find("outside [0, 1]"), std::string::npos) << err;
    b = g;
    b.specs = {"policy=window windwo=3"};
    EXPECT_FALSE(expand_task_grid(*ck_, text, b, &rows, &err));
    EXPECT_NE(err.find("windwo"), std::string::npos) << err;
    b = g;
    b.tasks = {"needle"};
    EXPECT_FALSE(expand_task_grid(*ck_, text, b, &rows, &err));
    EXPECT_NE(err.find("unknown task 'needle'"), std::string::npos) << err;
    EXPECT_FALSE(expand_task_grid(*ck_, text.substr(0, 200), g, &rows, &err));
    EXPECT_NE(err.find("the text has 200 bytes"), std::string::npos) << err;
}

// Issue 29, defect 3: a spec with an explicit size (window=64, budget=96, capacity under lethe, a
// simlayerkv window) runs once as given, for any --compression-ratio list (0 included); specs
// without one take every ratio; full KV still runs once.
TEST_F(TaskModel, ExplicitSizeRunsOnceAsGiven) {
    const std::string &text = eval_text();
    TaskGrid g;
    g.tasks = {"passkey"};
    g.specs = {"policy=full capacity=400", "policy=window window=64", "policy=snapkv budget=96", "policy=snapkv",
               "policy=streaming sinks=4", "policy=simlayerkv nonlazy=snapkv window=32", "policy=think token_policy=snapkv budget=80"};
    g.settings = {kSettings[0]};
    g.lengths = {256};
    g.depths = {0.5};
    for (const std::vector<double> &ratios : {std::vector<double>{0.5, 0.75, 0.875}, std::vector<double>{0}}) {
        g.ratios = ratios;
        std::vector<TaskResult> rows;
        std::string err;
        ASSERT_TRUE(expand_task_grid(*ck_, text, g, &rows, &err)) << err;
        std::vector<std::pair<std::string, double>> got;
        for (const TaskResult &r : rows) got.push_back({r.policy, r.ratio});
        std::vector<std::pair<std::string, double>> want = {{"policy=full capacity=400", -1},
                                                            {"policy=window window=64", -1},
                                                            {"policy=snapkv budget=96", -1}};
        for (double r : ratios) want.push_back({"policy=snapkv compression_ratio=" + std::string(r == 0 ? "0" : r == 0.5 ? "0.5" : r == 0.75 ? "0.75" : "0.875"), r});
        for (double r : ratios)
            want.push_back({"policy=streaming sinks=4 compression_ratio=" + std::string(r == 0 ? "0" : r == 0.5 ? "0.5" : r == 0.75 ? "0.75" : "0.875"), r});
        want.push_back({"policy=simlayerkv nonlazy=snapkv window=32", -1});
        want.push_back({"policy=think token_policy=snapkv budget=80", -1});
        EXPECT_EQ(got, want);
    }
    // and they run: the as-given specs resolve to themselves
    g.ratios = {0.5};
    std::vector<TaskResult> rows;
    std::string err;
    ASSERT_TRUE(expand_task_grid(*ck_, text, g, &rows, &err)) << err;
    ASSERT_TRUE(run_task_rows(*ck_, text, &rows, 2, &err)) << err;
    EXPECT_EQ(rows[1].spec, "policy=window window=64");
    EXPECT_EQ(rows[0].correct, 1) << "full KV answers";
    // the report: full KV in its column, the as-given specs in theirs (a row each, named whole)
    const std::string rep = task_report(rows);
    EXPECT_NE(rep.find("| policy | query-aware 50% | as given | full KV |"), std::string::npos) << rep;
    EXPECT_NE(rep.find("| `window window=64` | | 0."), std::string::npos) << rep;
    EXPECT_NE(rep.find("| `full` | | | 1.00 ("), std::string::npos) << rep;
    EXPECT_EQ(rep.find("Warning"), std::string::npos) << rep;
}

// With any --policy list the full-KV baseline is added (unless one is full already).
TEST_F(TaskModel, FullKvBaselineRunsWithAnyPolicyList) {
    EXPECT_EQ(task_specs_with_baseline(*ck_, {"policy=window window=64"}, {256, 512}),
              (std::vector<std::string>{"policy=full capacity=576", "policy=window window=64"}));
    EXPECT_EQ(task_specs_with_baseline(*ck_, {"policy=snapkv", "policy=full capacity=300"}, {256}),
              (std::vector<std::string>{"policy=snapkv", "policy=full capacity=300"}));
    const auto d = task_specs_with_baseline(*ck_, default_task_specs(), {1000});
    ASSERT_EQ(d.size(), default_task_specs().size() + 1);
    EXPECT_EQ(d[0], "policy=full capacity=1064");
}

// A full-KV baseline that answers nothing is flagged: the model cannot do the task.
// The grid through llama.cpp (ports/llama.cpp/tasks.sh): the rows file holds every row's prompt
// and spec as applied; a results file that answers each row with the ids the harness generated and
// its bytes reads back into rows the harness's own run equals (scores, text, bytes, kv ratio); bad
// results files are refused.
TEST_F(TaskModel, PortRowsAndResults) {
    const std::string &text = eval_text();
    TaskGrid g = small_grid();
    std::vector<TaskResult> rows, ran;
    std::string err;
    ASSERT_TRUE(expand_task_grid(*ck_, text, g, &rows, &err)) << err;
    ran = rows;
    ASSERT_TRUE(run_task_rows(*ck_, text, &ran, 1, &err)) << err;
    const std::string path = ::testing::TempDir() + "port_rows.txt";
    ASSERT_TRUE(write_port_rows(*ck_, text, rows, path, &err)) << err;
    std::string rows_text;
    {
        std::ifstream f(path, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        rows_text = ss.str();
    }
    std::istringstream in(rows_text);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "kvprune-task-rows 1");
    std::getline(in, line);
    EXPECT_EQ(line, std::to_string(rows.size()));
    std::string results = "kvprune-task-results 1\n";
    for (size_t i = 0; i < rows.size(); i++) {
        std::getline(in, line);
        std::istringstream ls(line);
        std::string word, spec;
        size_t idx = 0, na = 0, nc = 0, nq = 0;
        int aware = -1;
        ASSERT_TRUE(ls >> word >> idx >> aware >> na >> nc >> nq) << line;
        std::getline(ls >> std::ws, spec);
        EXPECT_EQ(idx, i);
        EXPECT_EQ(aware, rows[i].setting == kSettings[0] ? 1 : 0);
        EXPECT_EQ(nc + nq, 256u) << "the prompt is exactly the length";
        EXPECT_EQ(na, ran[i].answer.size());
        EXPECT_EQ(spec, ran[i].spec) << "the spec as the harness applies it";
        std::string ids;
        std::getline(in, ids);  // context
        std::istringstream is(ids);
        size_t n = 0;
        for (int t; is >> t;) n++;
        EXPECT_EQ(n, nc);
        std::getline(in, ids);  // question
        // answer row i with the harness's own generated bytes (byte model: ids are bytes)
        std::string gen_ids;
        for (unsigned char c : ran[i].generated) gen_ids += " " + std::to_string((int)c);
        results += "row " + std::to_string(i) + " " + std::to_string(ran[i].live_bytes) + " " +
                   std::to_string(ran[i].peak_live_bytes) + " " + std::to_string(ran[i].arena_bytes) + " " +
                   std::to_string(256 + na - 1) + " " + std::to_string(ran[i].generated.size()) + gen_ids + "\n";
    }
    std::vector<TaskResult> port = rows;
    ASSERT_TRUE(read_port_results(*ck_, text, results, "r.txt", &port, &err)) << err;
    for (size_t i = 0; i < rows.size(); i++) {
        EXPECT_EQ(port[i].spec, ran[i].spec) << i;
        EXPECT_EQ(port[i].answer, ran[i].answer) << i;
        EXPECT_EQ(port[i].generated, ran[i].generated) << i;
        EXPECT_EQ(port[i].correct, ran[i].correct) << i;
        EXPECT_EQ(port[i].byte_accuracy, ran[i].byte_accuracy) << i;
        EXPECT_EQ(port[i].live_bytes, ran[i].live_bytes) << i;
        EXPECT_NEAR(port[i].kv_ratio, ran[i].kv_ratio, 1e-12) << i;
        EXPECT_EQ(port[i].answer_nll, 0) << "not measured through the port";
    }
    EXPECT_GT(port[0].correct, 0) << "full KV answers";
    // refused: another header, a missing row, a repeated row, a row the grid lacks, fewer ids than said
    const std::string head = "kvprune-task-results 1\n";
    const std::string body = results.substr(head.size());
    const std::string first = body.substr(0, body.find('\n') + 1);
    for (const std::string &bad : {std::string("kvprune-task-rows 1\n") + body, head + body.substr(first.size()),
                                   head + body + first, head + body + "row 99 1 1 1 1 0\n", head + "row 0 1 1 1 1 5 1 2\n"}) {
        std::vector<TaskResult> b = rows;
        EXPECT_FALSE(read_port_results(*ck_, text, bad, "r.txt", &b, &err)) << bad.substr(0, 60);
        EXPECT_FALSE(err.empty());
    }
}

TEST(Tasks, ReportFlagsAFullKvBaselineThatScoresZero) {
    std::vector<TaskResult> rs;
    for (int i = 0; i < 4; i++) {
        TaskResult r;
        r.task = "passkey";
        r.setting = kSettings[i % 2];
        r.policy = i < 2 ? "policy=full capacity=600" : "policy=window compression_ratio=0.5";
        r.ratio = i < 2 ? -1 : 0.5;
        r.length = 500;
        r.correct = 0;
        rs.push_back(r);
    }
    std::string rep = task_report(rs);
    EXPECT_NE(rep.find("**Warning: full KV scores 0 on passkey** (query-aware, 1 cell; query-agnostic, 1 cell): the model "
                       "cannot do this task"),
              std::string::npos)
        << rep;
    rs[0].correct = 1;
    rep = task_report(rs);
    EXPECT_NE(rep.find("**Warning: full KV scores 0 on passkey** (query-agnostic, 1 cell)"), std::string::npos) << rep;
    rs[1].correct = 1;
    EXPECT_EQ(task_report(rs).find("Warning"), std::string::npos);
}

// The memory plot's legend (issue 29): beside each panel in an 11-point font, not 8-point below the
// panels where it ran into the x-axis label; the canvas grows with the number of series.
TEST(Tasks, MemoryPlotLegendIsBesideThePanelsAndReadable) {
    std::vector<TaskResult> rs;
    for (int i = 0; i < 30; i++) {
        TaskResult r;
        r.task = "passkey";
        r.setting = kSettings[i % 2];
        r.policy = "policy=snapkv pool_kernel=" + std::to_string(3 + 2 * (i / 2)) + " compression_ratio=0.5";
        r.ratio = 0.5;
        r.length = 256;
        r.live_bytes = 1000 + (uint64_t)i;
        rs.push_back(r);
    }
    int w = 0, h = 0;
    const std::string s = task_memory_script(rs, "passkey", "", &w, &h);
    EXPECT_NE(s.find("set key outside right top vertical"), std::string::npos) << s;
    EXPECT_NE(s.find("font ',11'"), std::string::npos) << s;
    EXPECT_EQ(s.find("set key below"), std::string::npos) << s;
    EXPECT_EQ(s.find("font ',8'"), std::string::npos) << s;
    EXPECT_GE(h, 2 * (60 + 22 * 15)) << "15 series per panel, two panels";
}

// DuoAttention's calibration (kvprune duo-calibrate, issue 32 item 2) on the bundled retrieval
// model: the needle masses are attention masses (in [0, 1]) and differ between heads; the role
// table's file round-trips; a Session with the table (half the heads streaming) has a smaller arena
// and its retrieval heads still answer the passkey.
TEST(Tasks, DuoCalibrationOnTheRetrievalModel) {
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(load_checkpoint(kDir + "/induction6.bin", &ck, &err)) << err;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::pair<int, int>> needle;
    std::vector<int> qat;
    for (int i = 0; i < 4; i++) {
        TaskPrompt p;
        ASSERT_TRUE(make_task_prompt("passkey", eval_text(), 256, i / 3.0, i, 0, &p, &err)) << err;
        std::vector<int32_t> ids;
        for (char c : p.context + p.question) ids.push_back((unsigned char)c);
        prompts.push_back(ids);
        needle.push_back({(int)p.needle_at, (int)(p.needle_at + p.needle.size())});
        qat.push_back((int)p.context.size());
    }
    std::vector<double> mass;
    ASSERT_TRUE(calibrate_duo_mass(ck, prompts, needle, qat, &mass, &err)) << err;
    const size_t n = (size_t)ck.cfg.n_layers * ck.cfg.n_kv_heads;
    ASSERT_EQ(mass.size(), n);
    double lo = 1, hi = 0;
    for (double x : mass) {
        EXPECT_GE(x, 0.0);
        EXPECT_LE(x, 1.0 + 1e-6);
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    EXPECT_GT(hi, lo + 0.05);  // some head attends to the needle far more than another
    const std::vector<uint8_t> roles = duo_roles_from_mass(mass, 0.5);
    size_t streaming = 0;
    for (size_t i = 0; i < n; i++) {
        streaming += roles[i];
        for (size_t j = 0; j < n; j++)
            if (roles[i] == KVP_HEAD_STREAMING && roles[j] == KVP_HEAD_RETRIEVAL) {
                EXPECT_LE(mass[i], mass[j]);
            }
    }
    EXPECT_EQ(streaming, (size_t)std::llround(0.5 * (double)n));
    std::vector<uint8_t> back;
    ASSERT_TRUE(parse_duo_roles(duo_roles_file(roles, mass, ck.cfg.n_layers, ck.cfg.n_kv_heads, "test"), ck.cfg, &back, &err))
        << err;
    EXPECT_EQ(back, roles);
    EXPECT_FALSE(parse_duo_roles("duo_roles 1 1\n0 0 1\n", ck.cfg, &back, &err));
    EXPECT_NE(err.find("the model has"), std::string::npos) << err;

    TaskPrompt p;
    ASSERT_TRUE(make_task_prompt("passkey", eval_text(), 256, 0.5, 9, 0, &p, &err)) << err;
    const std::string spec = "policy=full capacity=300 duo_sink=4 duo_window=32";
    Session plain, duo;
    ASSERT_TRUE(plain.init(ck, spec, &err)) << err;
    Session::set_duo_roles(&roles);
    const bool ok = duo.init(ck, spec, &err);
    Session::set_duo_roles(nullptr);
    ASSERT_TRUE(ok) << err;
    TaskResult rp, rd;
    ASSERT_TRUE(run_task_cell(plain, p, true, &rp, &err)) << err;
    ASSERT_TRUE(run_task_cell(duo, p, true, &rd, &err)) << err;
    EXPECT_LT(rd.arena_bytes, rp.arena_bytes);
    EXPECT_LT(rd.live_bytes, rp.live_bytes);
    EXPECT_TRUE(rp.correct) << rp.generated;
    EXPECT_TRUE(rd.correct) << rd.generated << " (the retrieval heads keep the needle)";
}
