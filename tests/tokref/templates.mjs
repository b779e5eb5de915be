// Reference test of kvpd's chat templates (model/template.c). For each family a
// random-weight GGUF carrying a real vocabulary and a chat template is written with
// `kvp synth --tokenizer-json --tokenizer-config`; the helper build/tests/sessions/
// render_chat renders multi-turn OpenAssistant conversations (5 user turns without a
// system prompt, 3 with one) from scratch and turn by turn. Checked:
//  - the rendering's ids equal transformers.js's: apply_chat_template(...,
//    {add_generation_prompt: true}) where the real template is there and its Jinja
//    engine parses it (Llama 3's package, Phi-3's template written out below); for the
//    other families (no npm tokenizer, or Qwen3's template that the engine cannot parse)
//    the exact text the family's template documents, written out below, encoded by
//    transformers.js (which splits out the special tokens as HF does);
//  - the session's transcript built turn by turn equals the rendering from scratch
//    (the replies being the tokens the template renders for them).
// Families without their own npm vocabulary use Llama 2's (TinyLlama's is the same),
// with Phi-3's and Gemma's turn markers added as special tokens.
//
//   KVP_BUILD=build node tests/tokref/templates.mjs    (meson test runs it)
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const source = resolve(process.env.KVP_SOURCE || join(here, "..", ".."));
const build = resolve(process.env.KVP_BUILD || join(source, "build"));
const shared = resolve(process.env.KVP_SHARED || join(source, "..", "shared"));
const kvp = join(build, "tools", "kvp");
const renderChat = join(build, "tests", "model", "render_chat");
const require = createRequire(import.meta.url);
const tmp = mkdtempSync(join(tmpdir(), "kvp-tplref-"));

let passed = 0, failed = 0;
function check(cond, msg) {
  if (cond) { passed++; console.log(`ok: ${msg}`); }
  else { failed++; console.log(`FAIL: ${msg}`); }
}

// ---- conversations: OpenAssistant threads (3 turns at most each; two joined make 5) ----
const threads = readFileSync(join(shared, "datasets", "oasst", "oasst_en100_longest_threads.jsonl"), "utf8")
  .split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l).messages)
  .filter((m) => m.length >= 6 && m.slice(0, 6).every((x, i) => x.role === (i % 2 ? "assistant" : "user")));
const SYSTEM = "You are a helpful assistant. Answer briefly.";
check(threads.length >= 3, `${threads.length} OpenAssistant threads of 3 turns`);
const conversations = [
  { name: "5 turns", system: null, messages: threads[0].slice(0, 6).concat(threads[1].slice(0, 3)) },
  { name: "3 turns + system", system: SYSTEM, messages: threads[2].slice(0, 5) },
];

// ---- the documented renderings ----
const trim = (s) => s.trim();
const doc = {
  chatml: (sys, msgs, defaultSystem = null) =>
    ((sys ?? defaultSystem) !== null ? `<|im_start|>system\n${sys ?? defaultSystem}<|im_end|>\n` : "") +
    msgs.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join("") + "<|im_start|>assistant\n",
  llama2: (sys, msgs) => msgs.map((m, i) => m.role === "user"
    ? `<s>[INST] ${((i === 0 && sys ? `<<SYS>>\n${sys}\n<</SYS>>\n\n` : "") + m.content).trim()} [/INST]`
    : ` ${m.content.trim()} </s>`).join(""),
  mistral: (sys, msgs) => "<s>" + msgs.map((m, i) => m.role === "user"
    ? `[INST] ${(i === 0 && sys ? `${sys}\n\n` : "") + m.content} [/INST]` : `${m.content}</s>`).join(""),
  zephyr: (sys, msgs) => (sys ? `<|system|>\n${sys}</s>\n` : "") +
    msgs.map((m) => `<|${m.role}|>\n${m.content}</s>\n`).join("") + "<|assistant|>\n",
  phi3: (sys, msgs) => (sys ? `<|system|>\n${sys}<|end|>\n` : "") +
    msgs.map((m) => `<|${m.role}|>\n${m.content}<|end|>\n`).join("") + "<|assistant|>\n",
  llama31: (sys, msgs) => "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
    `Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n${sys ? sys.trim() : ""}<|eot_id|>` +
    msgs.map((m) => `<|start_header_id|>${m.role}<|end_header_id|>\n\n${m.content.trim()}<|eot_id|>`).join("") +
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
  gemma: (sys, msgs) => "<s>" + msgs.map((m, i) =>
    `<start_of_turn>${m.role === "user" ? "user" : "model"}\n${i === 0 && sys ? `${sys}\n\n` : ""}${trim(m.content)}<end_of_turn>\n`).join("") +
    "<start_of_turn>model\n",
};

function pkg(name) {
  const dir = dirname(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer.json`));
  return { json: JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
           config: JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")) };
}
const qwen = pkg("qwen3"), llama3 = pkg("llama3"), llama2 = pkg("llama2");
// Llama 2's vocabulary with more special tokens (ids after its 32000).
function withSpecials(names) {
  const json = structuredClone(llama2.json);
  names.forEach((content, i) => json.added_tokens.push({ id: 32000 + i, content, single_word: false,
    lstrip: false, rstrip: false, normalized: false, special: true }));
  return json;
}
// Templates: the text kvpd detects the family from (the real ones where a package has
// them; otherwise the markers the family's template contains).
const QWEN25 = "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
// Phi-3-mini-4k-instruct's template as its tokenizer_config.json carries it (no package
// here has it): kvpd renders it through its Jinja interpreter, transformers.js's
// apply_chat_template is the reference.
const PHI3 = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}" +
  "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}" +
  "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}" +
  "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";
const PHI3_SPECIALS = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"];
const families = [
  { name: "llama3", vocab: llama3.json, config: llama3.config, format: "", applyTemplate: true },
  { name: "llama3.1 (dated system block)", vocab: llama3.json,
    config: { ...llama3.config, chat_template: '{{- "Cutting Knowledge Date: December 2023\\n" }}<|start_header_id|>' },
    format: "", doc: doc.llama31 },
  { name: "chatml (qwen3)", vocab: qwen.json, config: qwen.config, format: "", doc: doc.chatml },
  { name: "chatml (qwen2.5 default system)", vocab: qwen.json, config: { ...qwen.config, chat_template: QWEN25 },
    format: "", doc: (s, m) => doc.chatml(s, m, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") },
  { name: "llama2", vocab: llama2.json, config: { ...llama2.config, chat_template: "[INST] <<SYS>>" }, format: "", doc: doc.llama2 },
  { name: "mistral", vocab: llama2.json, config: { ...llama2.config, chat_template: "[INST]" }, format: "", doc: doc.mistral },
  { name: "zephyr (tinyllama)", vocab: llama2.json, config: { ...llama2.config, chat_template: "<|user|>" }, format: "", doc: doc.zephyr },
  { name: "phi3", vocab: withSpecials(PHI3_SPECIALS),
    config: { ...llama2.config, chat_template: "<|user|> <|end|>" }, format: "", doc: doc.phi3 },
  { name: "phi3 (Hugging Face template)", vocab: withSpecials(PHI3_SPECIALS),
    config: { ...llama2.config, chat_template: PHI3, eos_token: "<|endoftext|>" }, format: "", applyTemplate: true },
  { name: "gemma", vocab: withSpecials(["<start_of_turn>", "<end_of_turn>"]),
    config: { ...llama2.config, chat_template: "<start_of_turn>" }, format: "", doc: doc.gemma },
  { name: "chatml by config override", vocab: qwen.json, config: { ...qwen.config, chat_template: "[INST] (detected as mistral; the override wins)" },
    format: "chatml", doc: doc.chatml },
];

function firstDiff(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

try {
  for (const f of families) {
    const base = join(tmp, f.name.replace(/[^a-z0-9]+/g, "_"));
    writeFileSync(`${base}.json`, JSON.stringify(f.vocab));
    writeFileSync(`${base}.config.json`, JSON.stringify(f.config));
    execFileSync(kvp, ["synth", "--out", `${base}.gguf`, "--dim", "8", "--hidden", "16", "--layers", "1",
      "--heads", "2", "--tokenizer-json", `${base}.json`, "--tokenizer-config", `${base}.config.json`], { stdio: "pipe" });
    const ref = TokenizerLoader.fromPreTrained({ tokenizerJSON: f.vocab, tokenizerConfig: f.config });
    for (const c of conversations) {
      const messages = (c.system ? [{ role: "system", content: c.system }] : []).concat(c.messages);
      const want = f.applyTemplate
        ? Array.from(ref.apply_chat_template(messages, { add_generation_prompt: true, tokenize: true, return_tensor: false }))
        : ref.encode(f.doc(c.system, c.messages), { add_special_tokens: false });
      let out;
      try {
        out = JSON.parse(execFileSync(renderChat, [`${base}.gguf`, f.format],
          { input: JSON.stringify({ system: c.system, messages: c.messages }), stdio: ["pipe", "pipe", "pipe"], maxBuffer: 1 << 26 }));
      } catch (e) {
        check(false, `${f.name}, ${c.name}: render_chat failed: ${e.stderr}`);
        continue;
      }
      const d = firstDiff(out.render, want);
      check(d < 0, `${f.name}, ${c.name}: ${out.render.length} ids equal the reference's ${want.length}` +
        (d < 0 ? "" : ` (first difference at ${d}: kvpd ${out.render.slice(d, d + 6)} vs ${want.slice(d, d + 6)}` +
          ` near ${JSON.stringify(ref.decode(want.slice(Math.max(0, d - 6), d + 6)))})`));
      check(firstDiff(out.transcript, out.render) < 0,
        `${f.name}, ${c.name}: the transcript built turn by turn equals the rendering from scratch`);
    }
  }
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
