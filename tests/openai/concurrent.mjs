// Conversations started at the same moment share their common prefix, through the
// official `openai` SDK (pinned in package.json) on a qwen2-shaped synthetic model with
// Qwen3's real tokenizer and ChatML template (kvp synth), whose template renders the
// system prompt. Sixteen conversations with the same system prompt of more than 600
// tokens are sent at once (Promise.all), each with its own short user message: the first
// one's turn prefills the system prompt, the others wait for it and fork its cache
// (sessions/hub_wait.c), so in all the daemon prefills the system prompt once, plus each
// conversation's own tokens, plus at most a chunk each. The system prompt's length comes
// from another API key (another tenant, whose sessions the first key's never fork): its
// second conversation's cached_tokens is the rendering both of its conversations share.
// Exits non-zero on any failure.
//
//   KVP_BUILD=build node tests/openai/concurrent.mjs   (meson test openai/concurrent runs it)
import { checker, importOpenAI, spawnKvpd, stopKvpd, synthQwen3 } from "./lib.mjs";

const KEY_A = "concurrent-a-key", KEY_B = "concurrent-b-key";
const CHUNK = 32, N = 16;
const check = checker("concurrent");
const OpenAI = await importOpenAI("concurrent");

async function metric(port, name) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const m = text.match(new RegExp(`^${name.replace(/[{}"]/g, "\\$&")} (\\d+)`, "m"));
  return m ? Number(m[1]) : NaN;
}

const topics = ["the weather", "a recipe", "the train times", "a poem", "the news", "a film",
  "the garden", "a museum", "the market", "a bicycle", "the river", "a library"];
const system = "You are the help desk of the city of Northbridge. " + Array.from({ length: 24 },
  (_, i) => `Rule ${i + 1}: when someone asks about ${topics[i % topics.length]}, answer ` +
    `politely in two short sentences and name office ${100 + 7 * i}.`).join(" ");

async function main() {
  const { model, dir } = synthQwen3("kvp-concurrent-");
  const k = await spawnKvpd(["--listen", "127.0.0.1:0", "--model", model, "--workers", "2",
    "--budget", "0", "--chunk", String(CHUNK), "--temperature", "0", "--max-tokens", "64",
    "--api-key", `${KEY_A},${KEY_B}`, "--max-sessions", "64",
    // no state dir: the default one is shared by the suite's daemons, one at a time
    "--state-dir", ""]);
  try {
    const client = (key) => new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: key, maxRetries: 0 });
    const a = client(KEY_A), b = client(KEY_B);
    const id = (await a.models.list()).data[0].id;
    const ask = (c, user) => c.chat.completions.create({ model: id, max_tokens: 48,
      messages: [{ role: "system", content: system }, { role: "user", content: user }] });

    // The rendering every conversation of the system prompt shares, measured under key B.
    const rb1 = await ask(b, "Hello there.");
    const rb2 = await ask(b, "What is open today?");
    const P = rb2.usage.prompt_tokens_details.cached_tokens;
    check(P >= 600 && P < rb2.usage.prompt_tokens,
          `the system prompt's rendering is ${P} tokens (of ${rb1.usage.prompt_tokens} and ${rb2.usage.prompt_tokens})`);

    // Sixteen at once under key A: nothing of key B's is a source for them.
    const waitsBefore = await metric(k.port, "kvpd_prefix_waits_total");
    const rs = await Promise.all(Array.from({ length: N },
      (_, i) => ask(a, `Question ${i + 1}: where do I ask about ${topics[i % topics.length]}?`)));
    let prefilled = 0, own = 0;
    rs.forEach((r, i) => {
      const u = r.usage, cached = u.prompt_tokens_details.cached_tokens;
      check(r.kvpd.prefilled_tokens === u.prompt_tokens - cached,
            `conversation ${i + 1}: prefilled ${r.kvpd.prefilled_tokens} = prompt ${u.prompt_tokens} - cached ${cached}`);
      check(u.prompt_tokens > P, `conversation ${i + 1}: its prompt holds the system prompt and more`);
      prefilled += r.kvpd.prefilled_tokens;
      own += u.prompt_tokens - P;
    });
    check(new Set(rs.map((r) => r.session)).size === N, `${N} conversations, ${N} sessions`);
    const sources = rs.filter((r) => r.usage.prompt_tokens_details.cached_tokens === 0).length;
    check(sources === 1, `one conversation prefilled the system prompt (${sources} found nothing cached)`);
    check(prefilled <= P + own + N * CHUNK,
          `${prefilled} tokens prefilled in all, at most the system prompt's ${P} + their own ${own} + a chunk each (${N * CHUNK})`);
    const waits = await metric(k.port, "kvpd_prefix_waits_total") - waitsBefore;
    console.log(`concurrent: ${waits} of ${N - 1} waited for the first one's turn (the rest forked it idle)`);
    check(waits >= 1, "kvpd_prefix_waits_total counts the requests that waited");
  } finally {
    const code = await stopKvpd(k, dir);
    check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
  }
}

main().then(() => console.log("concurrent: all passed"), (e) => {
  console.error(`concurrent: ${e.stack || e}`);
  process.exit(1);
});
