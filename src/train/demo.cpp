#include "train/demo.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "train/trainer.h"

namespace mt {

namespace fs = std::filesystem;

bool DemoResult::targets_met() const {
  return code_pretrained <= 0.7 * unigram_code && lora_share < 0.05 &&
         prose_lora <= 0.85 * prose_pretrained && code_lora < 1.05 * code_pretrained;
}

namespace {

// fortune text files: the names without an extension (the .dat indexes are binary, the .u8
// entries links).
std::vector<std::string> fortune_files(const std::string& dir) {
  MT_CHECK(fs::is_directory(dir), IoError, "prose corpus '", dir,
           "' does not exist (tools/setup.sh installs the fortunes package)");
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && !e.is_symlink() && !e.path().has_extension())
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  MT_CHECK(!out.empty(), IoError, "prose corpus '", dir, "' holds no fortune files");
  return out;
}

// The *.py files under dir, sorted, without the empty ones (package markers such as
// email/mime/__init__.py): read_corpus rightly rejects an empty input, but a directory of
// sources legitimately holds some.
std::vector<std::string> code_files(const std::string& dir) {
  MT_CHECK(fs::is_directory(dir), IoError, "code corpus '", dir, "' does not exist");
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() == ".py" &&
        e.file_size() > 0)
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  MT_CHECK(!out.empty(), IoError, "code corpus '", dir, "' holds no non-empty *.py files");
  return out;
}

}  // namespace

DemoResult run_demo(const DemoOptions& o, std::ostream& log) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig cfg = ModelConfig::load(o.model);
  const fs::path work = o.work_dir;
  fs::create_directories(work);

  // 1. Corpora, split by document.
  std::vector<Document> code =
      read_corpus({.inputs = code_files(o.code_dir), .max_bytes = o.code_bytes});
  std::vector<Document> prose =
      read_corpus({.inputs = fortune_files(o.prose_dir), .separator = "%"});
  std::vector<Document> code_tr, code_ho, prose_tr, prose_ho;
  split_corpus(code, 0.1, code_tr, code_ho);
  split_corpus(prose, 0.1, prose_tr, prose_ho);
  log << "corpora: code " << code_tr.size() << " train / " << code_ho.size()
      << " held-out files from " << o.code_dir << "; prose " << prose_tr.size() << " / "
      << prose_ho.size() << " fortunes from " << o.prose_dir << "\n";

  // 2. Tokenizer on both training splits, vocabulary = the model's.
  std::vector<std::string> texts;
  for (const auto* set : {&code_tr, &prose_tr})
    for (const Document& d : *set) texts.push_back(d.text);
  Tokenizer tok = Tokenizer::train(texts, {.vocab = cfg.vocab});
  tok.save((work / "tokenizer.model").string());
  auto pack = [&](const std::vector<Document>& d, const char* name) {
    PackedData p = pack_documents(d, tok, o.seq);
    write_dataset(p, (work / "data" / name).string());
    return p;
  };
  const PackedData ctr = pack(code_tr, "code_train"), cho = pack(code_ho, "code_heldout"),
                   ptr = pack(prose_tr, "prose_train"), pho = pack(prose_ho, "prose_heldout");
  DemoResult r;
  r.unigram_code = unigram_baseline(ctr, cho);
  r.unigram_prose = unigram_baseline(ptr, pho);
  log << "tokenizer: BPE " << tok.vocab() << " pieces; code " << ctr.target_tokens()
      << " train tokens, prose " << ptr.target_tokens() << "; unigram baseline loss: code "
      << r.unigram_code << ", prose " << r.unigram_prose << "\n";

  // 3. Pretraining on code (full), 4. LoRA on prose (base frozen).
  Job pre;
  pre.run_dir = (work / "pretrain").string();
  pre.seed = o.seed;
  pre.threads = o.threads;
  pre.model = o.model;
  pre.train_data = (work / "data" / "code_train").string();
  pre.eval_data = {{"code", (work / "data" / "code_heldout").string()},
                   {"prose", (work / "data" / "prose_heldout").string()}};
  pre.eval_sequences = o.eval_sequences;
  pre.lr = o.lr;
  pre.steps = o.steps;
  pre.warmup = std::max<int64_t>(1, o.steps / 10);
  pre.batch = o.batch;
  pre.log_every = 10;
  log << "== pretraining " << o.model << " on code\n";
  const TrainResult a = run_job(pre, {}, log);
  r.code_pretrained = a.eval.at("code").loss;
  r.prose_pretrained = a.eval.at("prose").loss;
  r.pretrain_tokens_per_s = a.tokens_per_s;

  Job ft = pre;
  ft.run_dir = (work / "lora").string();
  ft.init = a.checkpoint;
  ft.train_data = (work / "data" / "prose_train").string();
  ft.lora_targets = {"kda", "attention", "shared_experts", "dense_ffn"};
  ft.lora_rank = o.lora_rank;
  ft.lora_alpha = static_cast<float>(2 * o.lora_rank);
  ft.lr = o.lora_lr;
  ft.steps = o.lora_steps;
  ft.warmup = std::max<int64_t>(1, o.lora_steps / 10);
  log << "== LoRA fine-tuning on prose\n";
  const TrainResult b = run_job(ft, {}, log);
  r.code_lora = b.eval.at("code").loss;
  r.prose_lora = b.eval.at("prose").loss;
  r.lora_share = static_cast<double>(b.trainable) / static_cast<double>(b.total);
  r.lora_tokens_per_s = b.tokens_per_s;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  char buf[512];
  log << "\nheld-out loss (nats/token)   code      prose\n";
  std::snprintf(buf, sizeof buf,
                "unigram baseline           %7.3f   %7.3f\n"
                "after pretraining (code)   %7.3f   %7.3f   code %.0f%% below unigram\n"
                "after LoRA (prose)         %7.3f   %7.3f   prose %+.1f%%, code %+.1f%%\n"
                "LoRA trains %.2f%% of %lld parameters; %.0f / %.0f tokens/s; %.0f s total\n",
                r.unigram_code, r.unigram_prose, r.code_pretrained, r.prose_pretrained,
                100 * (1 - r.code_pretrained / r.unigram_code), r.code_lora, r.prose_lora,
                100 * (r.prose_lora / r.prose_pretrained - 1),
                100 * (r.code_lora / r.code_pretrained - 1), 100 * r.lora_share,
                static_cast<long long>(b.total), r.pretrain_tokens_per_s, r.lora_tokens_per_s,
                r.seconds);
  log << buf << "targets (code >= 30% below unigram; LoRA < 5% of parameters, prose -15%, code "
      << "< +5%): " << (r.targets_met() ? "met" : "NOT met") << "\n";
  log << "(no generated sample: the generation API is not wired into the demo yet)\n";
  return r;
}

}  // namespace mt
