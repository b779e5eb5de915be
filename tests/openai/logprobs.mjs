// logprobs through the official `openai` SDK (pinned in package.json) against kvpd on
// stories260K: chat completions with logprobs / top_logprobs, whole and streamed (the
// SDK's stream helper gathers the chunks' logprobs), legacy completions' logprobs: N, and
// the refusals as the SDK's BadRequestError naming the field. The first reply token's
// values are checked against `kvp logits` on the prompt's tokens (log-softmax at
// temperature 1, whatever the request's temperature); every token's alternatives hold a
// mass of at most 1, and at temperature 0 the most likely alternative is the token drawn.
//
//   KVP_BUILD=build node tests/openai/logprobs.mjs      (meson test openai/logprobs)
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { build, checker, importOpenAI, shared, spawnKvpd } from "./lib.mjs";

const model = join(shared, "models", "stories260K.bin");
const tokenizer = join(shared, "models", "tok512.bin");
const PROMPT = "Once upon a time";
const check = checker("logprobs");
const OpenAI = await importOpenAI("logprobs");

// kvpd on stories260K, greedy, f32 KV rows (the logprobs compare with `kvp logits`).
const startKvpd = () => spawnKvpd([
  "--listen", "127.0.0.1:0", "--model", model, "--tokenizer", tokenizer,
  "--workers", "2", "--budget", "64", "--chunk", "16", "--kv-type", "f32",
  "--temperature", "0", "--max-tokens", "64", "--state-dir", "",
]);

// The log-softmax of the logits after the prompt, from `kvp logits` (BOS, then the
// prompt's ids, as the plain format's first turn has them), most likely first.
function engineFirst() {
  const kvp = join(build, "tools", "kvp");
  const ids = execFileSync(kvp, ["tokenize", "--model", model, "--tokenizer", tokenizer,
                                 "--text", PROMPT]).toString().trim().split(/\s+/).map(Number);
  const dir = mkdtempSync(join(tmpdir(), "kvp-logprobs-"));
  try {
    const out = join(dir, "logits.f32");
    execFileSync(kvp, ["logits", "--model", model, "--tokenizer", tokenizer,
                       "--tokens", [1, ...ids].join(","), "--out", out]);
    const buf = readFileSync(out);
    const all = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
    const vocab = all.length / (ids.length + 1);
    const row = all.subarray(ids.length * vocab);
    let mx = -Infinity;
    for (const v of row) mx = Math.max(mx, v);
    let sum = 0;
    for (const v of row) sum += Math.exp(v - mx);
    const lse = mx + Math.log(sum);
    return Array.from(row, (v) => v - lse).sort((a, b) => b - a);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function checkContent(content, top, greedy, label) {
  check(Array.isArray(content) && content.length > 0, `${label}: ${content.length} logprobs entries`);
  for (const [i, e] of content.entries()) {
    if (!(typeof e.token === "string" && e.logprob <= 0 && Array.isArray(e.bytes)))
      throw new Error(`FAIL: ${label}: entry ${i} malformed: ${JSON.stringify(e)}`);
    if (e.top_logprobs.length !== top)
      throw new Error(`FAIL: ${label}: entry ${i} has ${e.top_logprobs.length} alternatives`);
    const mass = e.top_logprobs.reduce((s, a) => s + Math.exp(a.logprob), 0);
    if (mass > 1 + 1e-5) throw new Error(`FAIL: ${label}: entry ${i}: mass ${mass}`);
    if (greedy && top && (e.top_logprobs[0].token !== e.token || e.top_logprobs[0].logprob !== e.logprob))
      throw new Error(`FAIL: ${label}: entry ${i}: greedy but ${e.token} is not the most likely`);
  }
  check(true, `${label}: every entry well formed, mass <= 1${greedy ? ", greedy = most likely" : ""}`);
}

const k = await startKvpd();
let failed = false;
try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: "none" });
  const messages = [{ role: "user", content: PROMPT }];
  const r = await client.chat.completions.create({ model: "gpt-4o-mini", messages, max_tokens: 16,
                                                   temperature: 0, logprobs: true, top_logprobs: 5 });
  const content = r.choices[0].logprobs.content;
  checkContent(content, 5, true, "chat");
  const bytes = Buffer.from(content.flatMap((e) => e.bytes)).toString();
  check(bytes === r.choices[0].message.content, "chat: the tokens' bytes spell the reply");

  const want = engineFirst();
  const got = content[0].top_logprobs.map((a) => a.logprob);
  check(got.every((v, i) => Math.abs(v - want[i]) < 1e-3),
        `chat: the first token's top 5 match kvp logits (${got.map((v) => v.toFixed(4))} vs ${want.slice(0, 5).map((v) => v.toFixed(4))})`);

  // temperature 1: the values stay the model's at temperature 1
  const t1 = await client.chat.completions.create({ model: "x", messages, max_tokens: 8, temperature: 1,
                                                    seed: 5, logprobs: true, top_logprobs: 20 });
  checkContent(t1.choices[0].logprobs.content, 20, false, "chat at temperature 1");
  const got1 = t1.choices[0].logprobs.content[0].top_logprobs.map((a) => a.logprob);
  check(got1.every((v, i) => Math.abs(v - want[i]) < 1e-3), "temperature 1: the first token's top 20 match kvp logits");

  // streamed through the SDK's helper: the same entries
  const stream = client.chat.completions.stream({ model: "x", messages, max_tokens: 16, temperature: 0,
                                                  logprobs: true, top_logprobs: 5 });
  let deltas = 0;
  stream.on("logprobs.content.delta", () => deltas++);
  const final = await stream.finalChatCompletion();
  check(deltas > 0, `stream: ${deltas} logprobs deltas`);
  // the same tokens; the values equal up to float rounding (an earlier request's cached
  // prefix may split the prefill into other chunks)
  const same = (a, b) => a.length === b.length && a.every((e, i) => e.token === b[i].token &&
    Math.abs(e.logprob - b[i].logprob) < 1e-4 && JSON.stringify(e.bytes) === JSON.stringify(b[i].bytes) &&
    (!e.top_logprobs || same(e.top_logprobs, b[i].top_logprobs)));
  check(same(final.choices[0].logprobs.content, content),
        "stream: the gathered entries equal the whole answer's");

  // legacy completions
  const c = await client.completions.create({ model: "x", prompt: PROMPT, max_tokens: 8, temperature: 0, logprobs: 3 });
  const lp = c.choices[0].logprobs;
  check(lp.tokens.length === lp.token_logprobs.length && lp.tokens.length === lp.top_logprobs.length &&
        lp.tokens.length === lp.text_offset.length && lp.tokens.length > 0, "completions: legacy shape");
  check(lp.tokens.join("") === c.choices[0].text, "completions: the tokens spell the text");
  check(lp.text_offset[0] === PROMPT.length, "completions: text_offset starts at the prompt's end");
  check(Math.abs(lp.token_logprobs[0] - want[0]) < 1e-3, "completions: the first value matches kvp logits");

  // refusals
  for (const [body, param] of [[{ logprobs: true, top_logprobs: 21 }, "top_logprobs"],
                               [{ top_logprobs: 2 }, "top_logprobs"],
                               [{ logprobs: "yes" }, "logprobs"]]) {
    try {
      await client.chat.completions.create({ model: "x", messages, max_tokens: 4, ...body });
      throw new Error(`FAIL: ${JSON.stringify(body)} was served`);
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === param,
            `${JSON.stringify(body)}: BadRequestError naming ${e.param}`);
    }
  }
} catch (e) {
  console.error(e.stack || String(e));
  failed = true;
} finally {
  k.proc.kill("SIGTERM");
}
process.exit(failed ? 1 : 0);
