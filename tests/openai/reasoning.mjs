// Reasoning blocks through the official `openai` SDK (pinned in package.json) against kvpd on
// a synthetic with Qwen3's tokenizer and template whose reply is known (kvp synth --chain):
// "<think>Let me see</think>\n\nHello". Chat completions return the block as
// message.reasoning_content and the answer as content, streamed as delta.reasoning_content
// then delta.content chunks (each of n choices too); the Responses API puts a reasoning item
// before the message (streamed: response.reasoning_text.delta / done), and a chained response
// (previous_response_id) goes on. A history sent back with reasoning_content renders as
// Qwen3's template says (an earlier reply's reasoning dropped: the same prompt as without
// it); reasoning_content that is not a string is the SDK's BadRequestError naming it.
//
//   KVP_BUILD=build node tests/openai/reasoning.mjs      (meson test openai/reasoning)
import { checker, importOpenAI, KEY, startKvpd, stopKvpd, synthQwen3Chain } from "./lib.mjs";

const check = checker("reasoning");
const OpenAI = await importOpenAI("reasoning");
const { model, dir } = synthQwen3Chain(["<think>", "Let", "Ġme", "Ġsee", "</think>", "ĊĊ", "Hello", "<|im_end|>"],
                                       "kvp-reasoning-");
const k = await startKvpd(model);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
const REASONING = "Let me see", ANSWER = "Hello";
let failed = false;
try {
  const user = { role: "user", content: "Hi" };
  const r = await client.chat.completions.create({ model: "any", messages: [user] });
  const m = r.choices[0].message;
  check(m.reasoning_content === REASONING, `message.reasoning_content: ${JSON.stringify(m.reasoning_content)}`);
  check(m.content === ANSWER, `message.content is the answer only: ${JSON.stringify(m.content)}`);
  check(r.choices[0].finish_reason === "stop", "the reply ends at its end marker");

  const stream = await client.chat.completions.create({ model: "any", messages: [user], stream: true, n: 2 });
  const got = [{ r: "", c: "", order: [] }, { r: "", c: "", order: [] }];
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      const g = got[ch.index];
      if (ch.delta.reasoning_content) { g.r += ch.delta.reasoning_content; g.order.push("r"); }
      if (ch.delta.content) { g.c += ch.delta.content; g.order.push("c"); }
    }
  }
  for (const [i, g] of got.entries()) {
    check(g.r === REASONING && g.c === ANSWER, `streamed choice ${i}: reasoning ${JSON.stringify(g.r)}, content ${JSON.stringify(g.c)}`);
    check(g.order.join("") === "r".repeat(g.order.indexOf("c")) + "c".repeat(g.order.length - g.order.indexOf("c")),
          `choice ${i}: every reasoning chunk comes before the content`);
  }

  // the history sent back: Qwen3's template drops an earlier reply's reasoning, so the
  // prompt is the one without it, and a reply sent back split continues the conversation
  const next = { role: "user", content: "And?" };
  const withR = await client.chat.completions.create({
    model: "any", max_tokens: 1, messages: [user, { role: "assistant", content: ANSWER, reasoning_content: REASONING }, next],
  });
  const withoutR = await client.chat.completions.create({
    model: "any", max_tokens: 1, messages: [user, { role: "assistant", content: ANSWER }, next],
  });
  check(withR.usage.prompt_tokens === withoutR.usage.prompt_tokens,
        `an earlier reply's reasoning is not in the prompt (${withR.usage.prompt_tokens} = ${withoutR.usage.prompt_tokens} tokens)`);
  check(withR.usage.prompt_tokens_details.cached_tokens > 0, `the cache is reused (${withR.usage.prompt_tokens_details.cached_tokens} tokens)`);
  try {
    await client.chat.completions.create({
      model: "any", messages: [user, { role: "assistant", content: ANSWER, reasoning_content: 7 }, next],
    });
    check(false, "reasoning_content 7 is refused");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.param === "messages[1].reasoning_content",
          `reasoning_content that is no string: 400 naming ${e.param}`);
  }

  // the Responses API: a reasoning item, then the message
  const resp = await client.responses.create({ model: "any", input: "Hi" });
  check(resp.output.length === 2 && resp.output[0].type === "reasoning" && resp.output[1].type === "message",
        `output items: ${resp.output.map((o) => o.type).join(", ")}`);
  check(resp.output[0].content[0].type === "reasoning_text" && resp.output[0].content[0].text === REASONING,
        `the reasoning item's text: ${JSON.stringify(resp.output[0].content)}`);
  check(resp.output_text === ANSWER, `output_text is the answer only: ${JSON.stringify(resp.output_text)}`);
  const chained = await client.responses.create({ model: "any", input: "And?", previous_response_id: resp.id });
  check(chained.output_text === ANSWER && chained.usage.input_tokens_details.cached_tokens > 0,
        `a chained response goes on (cached ${chained.usage.input_tokens_details.cached_tokens})`);

  const rs = await client.responses.create({ model: "any", input: "Hi", stream: true });
  const types = [];
  let rdelta = "", rdone = null, tdelta = "", final = null;
  for await (const ev of rs) {
    types.push(ev.type);
    if (ev.type === "response.reasoning_text.delta") rdelta += ev.delta;
    if (ev.type === "response.reasoning_text.done") rdone = ev.text;
    if (ev.type === "response.output_text.delta") tdelta += ev.delta;
    if (ev.type === "response.completed") final = ev.response;
  }
  const firstR = types.indexOf("response.reasoning_text.delta"), lastR = types.lastIndexOf("response.reasoning_text.done");
  check(firstR > 0 && lastR > firstR && lastR < types.indexOf("response.output_text.delta"),
        `the reasoning's events come before the text's: ${[...new Set(types)].join(", ")}`);
  check(rdelta === REASONING && rdone === REASONING && tdelta === ANSWER, "streamed: the reasoning and the answer");
  check(final && final.output[0].type === "reasoning" && final.output[1].type === "message",
        "response.completed holds the reasoning item, then the message");
} catch (e) {
  console.error(e);
  failed = true;
}
const code = await stopKvpd(k, dir);
if (failed || code !== 0) {
  console.error(`reasoning: FAIL (kvpd exit ${code})\n${k.log()}`);
  process.exit(1);
}
