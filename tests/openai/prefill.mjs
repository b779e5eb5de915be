// Assistant prefill through the official `openai` SDK (pinned in package.json) against
// kvpd on a synthetic with Qwen3's tokenizer and template, greedy: a conversation whose
// last message is the assistant's is continued (the answer is only the new text, whole and
// streamed alike), the finished message sent back with a new user message reuses the
// cache, and what cannot be continued is the SDK's BadRequestError naming the field.
//
//   KVP_BUILD=build node tests/openai/prefill.mjs      (meson test openai/prefill)
import { checker, importOpenAI, KEY, startKvpd, stopKvpd, synthQwen3 } from "./lib.mjs";

const check = checker("prefill");
const OpenAI = await importOpenAI("prefill");
const { model, dir } = synthQwen3("kvp-prefill-");
const k = await startKvpd(model, ["--temperature", "0"]);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
let failed = false;
try {
  const PREFILL = "Hello, I";
  const messages = [{ role: "user", content: "Hi there" }, { role: "assistant", content: PREFILL }];
  const r = await client.chat.completions.create({ model: "any", messages, max_tokens: 6 });
  const text = r.choices[0].message.content;
  check(typeof text === "string" && text.length > 0, `the prefill is continued: ${JSON.stringify(text)}`);
  check(!text.startsWith(PREFILL), "the answer holds only the new text");

  const stream = await client.chat.completions.create({ model: "any", messages, max_tokens: 6, stream: true });
  let streamed = "";
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
  check(streamed === text, `streamed, the same new text: ${JSON.stringify(streamed)}`);

  const next = await client.chat.completions.create({
    model: "any", max_tokens: 2,
    messages: [messages[0], { role: "assistant", content: PREFILL + text }, { role: "user", content: "And then?" }],
  });
  const cached = next.usage.prompt_tokens_details.cached_tokens;
  // Qwen3's template drops the last reply's empty think block once a user message follows:
  // the cache holds the first user turn and the reply's header at least
  check(cached >= 9, `the finished message sent back reuses the cache (${cached} tokens)`);

  for (const [content, param] of [["", "messages[1].content"]]) {
    try {
      await client.chat.completions.create({ model: "any", messages: [messages[0], { role: "assistant", content }] });
      check(false, `an empty prefill is refused`);
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === param, `an empty prefill: 400 naming ${e.param}`);
    }
  }
  try {
    await client.chat.completions.create({
      model: "any", messages, tool_choice: "required",
      tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }],
    });
    check(false, "a forced call with a prefill is refused");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.param === "tool_choice", `a forced call: 400 naming ${e.param}`);
  }
  const after = await client.chat.completions.create({ model: "any", messages: [messages[0]], max_tokens: 2 });
  check(after.choices[0].message.role === "assistant", "the daemon keeps serving");
} catch (e) {
  console.error(e);
  failed = true;
}
const code = await stopKvpd(k, dir);
if (failed || code !== 0) {
  console.error(`prefill: FAIL (kvpd exit ${code})\n${k.log()}`);
  process.exit(1);
}
