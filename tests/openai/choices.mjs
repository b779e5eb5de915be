// n choices through the official `openai` SDK (pinned in package.json) against kvpd on
// stories260K: n = 3 with a seed prefills the prompt once (the other choices fork the
// first one's cache and run only the prompt's last token again: kvpd.prefilled_tokens
// and kvpd_prefilled_tokens_total grow by the prompt plus 2), its choices differ from each
// other at temperature 1, an identical request gives the same choices, the stream gives
// every index its role, its content and one finish_reason (and the same texts), logprobs
// come per choice, temperature 0 gives identical choices, and bad values of n are 400s
// naming `n`.
//
//   KVP_BUILD=build node tests/openai/choices.mjs      (meson test openai/choices)
import { join } from "node:path";
import { checker, importOpenAI, shared, spawnKvpd, stopKvpd } from "./lib.mjs";

const check = checker("choices");
const OpenAI = await importOpenAI("choices");

const startKvpd = () => spawnKvpd([
  "--listen", "127.0.0.1:0", "--model", join(shared, "models", "stories260K.bin"),
  "--tokenizer", join(shared, "models", "tok512.bin"),
  "--workers", "2", "--budget", "256", "--chunk", "16", "--kv-type", "f32",
  "--temperature", "0", "--max-tokens", "64",
  // no state dir: the default one is shared by the suite's daemons, one at a time
  "--state-dir", "",
]);

async function metric(port, name) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\d+)`, "m"));
  return m ? Number(m[1]) : NaN;
}

async function main(k) {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: "none", maxRetries: 0 });
  const messages = [{ role: "user", content: "Once upon a time there was a little dog named Spot who" }];
  const ask = (extra) => client.chat.completions.create({ model: "gpt-4o-mini", messages,
                                                           max_tokens: 24, ...extra });
  const texts = (r) => r.choices.map((c) => c.message.content);

  // n = 3, seeded, at temperature 1: one prefill.
  const before = await metric(k.port, "kvpd_prefilled_tokens_total");
  const r1 = await ask({ n: 3, seed: 42, temperature: 1 });
  const after = await metric(k.port, "kvpd_prefilled_tokens_total");
  check(r1.choices.length === 3, `n=3: ${r1.choices.length} choices`);
  check(r1.choices.every((c, i) => c.index === i), "n=3: choices indexed 0, 1, 2 in order");
  check(r1.choices.every((c) => ["stop", "length"].includes(c.finish_reason) && c.message.role === "assistant"),
        "n=3: each choice an assistant message with its finish_reason");
  const P = r1.usage.prompt_tokens;
  check(P >= 8, `n=3: a prompt of ${P} tokens, counted once in usage.prompt_tokens`);
  check(r1.usage.completion_tokens >= 3 && r1.usage.total_tokens === P + r1.usage.completion_tokens,
        `n=3: usage sums the choices' completion tokens (${r1.usage.completion_tokens})`);
  check(r1.kvpd.prefilled_tokens === P + 2,
        `n=3: prefilled ${r1.kvpd.prefilled_tokens} tokens = the prompt (${P}) once, plus its last token for each other choice`);
  check(after - before === P + 2,
        `n=3: kvpd_prefilled_tokens_total grew by ${after - before} (not ${3 * P})`);
  const distinct = new Set(texts(r1)).size;
  check(distinct >= 2, `n=3 at temperature 1: ${distinct} distinct choices of 3`);

  // The same request again: the same choices (seed, seed + 1, seed + 2), its prompt cached.
  const r2 = await ask({ n: 3, seed: 42, temperature: 1 });
  check(JSON.stringify(texts(r2)) === JSON.stringify(texts(r1)),
        "n=3 with a seed: an identical request gives the same three choices");
  check(r2.kvpd.prefilled_tokens <= 3, `the repeat prefilled ${r2.kvpd.prefilled_tokens} tokens (its prompt was cached)`);

  // Streamed: every index gets its role, its content and one finish_reason.
  const stream = await ask({ n: 3, seed: 42, temperature: 1, stream: true,
                             stream_options: { include_usage: true } });
  const got = [0, 1, 2].map(() => ({ role: 0, text: "", finish: [] }));
  let usage = null, streamSession = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.kvpd) streamSession = chunk.kvpd.session;
    for (const c of chunk.choices) {
      if (!(c.index >= 0 && c.index < 3)) throw new Error(`FAIL: stream: a chunk of index ${c.index}`);
      const g = got[c.index];
      if (c.delta?.role) g.role++;
      if (c.delta?.content) g.text += c.delta.content;
      if (c.finish_reason) g.finish.push(c.finish_reason);
    }
  }
  check(got.every((g) => g.role === 1), "stream n=3: one role chunk per index");
  check(got.every((g) => g.finish.length === 1), "stream n=3: one finish_reason per index");
  check(JSON.stringify(got.map((g) => g.text)) === JSON.stringify(texts(r1)),
        "stream n=3: the same three choices as the whole answer");
  check(usage && usage.prompt_tokens === P && usage.completion_tokens === r1.usage.completion_tokens,
        "stream n=3: the usage chunk counts the prompt once and every choice's completion");

  // logprobs per choice.
  const rl = await ask({ n: 2, seed: 7, temperature: 1, logprobs: true, top_logprobs: 2 });
  check(rl.choices.every((c) => c.logprobs && c.logprobs.content.length > 0 &&
                         Buffer.from(c.logprobs.content.flatMap((e) => e.bytes)).toString() === c.message.content),
        "logprobs n=2: each choice's tokens spell its own reply");

  // Greedy: n choices are the same reply.
  const r0 = await client.chat.completions.create({ model: "gpt-4o-mini", max_tokens: 16, n: 3,
    messages: [{ role: "user", content: "The sun was shining and the birds" }] });
  check(r0.choices.length === 3 && new Set(texts(r0)).size === 1, "n=3 at temperature 0: three identical choices");

  // A later request continues the first choice's conversation (the three requests above
  // with seed 42 each left one holding that reply; the other choices' sessions are gone).
  const more = [...messages, { role: "assistant", content: r1.choices[0].message.content },
                { role: "user", content: "Then" }];
  const rc = await client.chat.completions.create({ model: "gpt-4o-mini", messages: more, max_tokens: 8 });
  check([r1.session, r2.session, streamSession].includes(rc.session),
        "the next turn continues a choice 0's session");
  check(rc.usage.prompt_tokens_details.cached_tokens >= P,
        `the next turn reused the conversation's cache (${rc.usage.prompt_tokens_details.cached_tokens} cached)`);

  // Bad n.
  for (const n of [0, 9, 1.5, "3", -1]) {
    let e = null;
    try {
      await ask({ n });
    } catch (err) {
      e = err;
    }
    check(e && e.status === 400 && e.param === "n", `n=${JSON.stringify(n)}: 400 naming n`);
  }
  for (const path of ["completions", "responses"]) {
    const res = await fetch(`http://127.0.0.1:${k.port}/v1/${path}`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify(path === "completions" ? { prompt: "Once", n: 2 } : { input: "Once", n: 2 }) });
    const body = await res.json();
    check(res.status === 400 && body.error.param === "n", `/v1/${path} with n=2: 400 naming n`);
  }
}

const k = await startKvpd();
let failed = false;
try {
  await main(k);
} catch (e) {
  console.error(e.message || e);
  failed = true;
} finally {
  const code = await stopKvpd(k);
  if (code !== 0) {
    console.error(`FAIL: kvpd exited ${code}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
