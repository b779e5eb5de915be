// The official `openai` SDK at the version tests/clients pins, against kvpd on a
// synthetic model with Qwen3's tokenizer and template (random weights): a chat turn, a
// forced tool call parsed by the SDK, and the tool result's turn continuing the cached
// conversation; .parse() with a zod schema 20 times at max_tokens 32 and at 64 (the
// length budget: every reply whole and valid, so .parse takes all 40, those the limit
// shaped included); the Responses API through the SDK's stream helper
// (responses.stream, finalResponse) for text and for a forced tool call.
//
//   KVP_BUILD=build node tests/clients/openai.mjs   (meson test --suite clients runs it)
import { checker, KEY, startKvpd, stopKvpd, synthQwen3 } from "../openai/lib.mjs";

const check = checker("clients/openai");
let OpenAI;
try {
  ({ default: OpenAI } = await import("openai"));
} catch (e) {
  console.error(`clients/openai: openai is not installed in tests/clients (run scripts/setup.sh): ${e.message}`);
  process.exit(1);
}

const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city.",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"],
                additionalProperties: false } } }];

const { model, dir } = synthQwen3("kvp-clients-openai-");
const k = await startKvpd(model);
let code;
try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
  const id = (await client.models.list()).data[0].id;
  const chat = await client.chat.completions.create({ model: id, max_tokens: 16,
    messages: [{ role: "user", content: "Hello" }] });
  check(typeof chat.choices[0].message.content === "string" && chat.usage.completion_tokens > 0,
        `a chat turn answers (${chat.usage.completion_tokens} tokens)`);
  const messages = [{ role: "user", content: "Weather in Oslo?" }];
  const r = await client.chat.completions.create({ model: id, max_tokens: 256, tools, tool_choice: "required", messages });
  const call = r.choices[0].message.tool_calls?.[0];
  check(r.choices[0].finish_reason === "tool_calls" && call?.function.name === "get_weather",
        `a tool call: ${JSON.stringify(call?.function)}`);
  const args = JSON.parse(call.function.arguments);
  check(typeof args.city === "string" && [...args.city].length <= 12, `its arguments parse: ${call.function.arguments}`);
  messages.push(r.choices[0].message, { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" });
  const r2 = await client.chat.completions.create({ model: id, max_tokens: 16, tools, messages });
  const cached = r2.usage.prompt_tokens_details?.cached_tokens ?? 0;
  check(cached > 0, `the tool result's turn reuses the cache (${cached} of ${r2.usage.prompt_tokens} prompt tokens)`);
  // The SDK's .parse() with a zod schema, 20 times at max_tokens 32 and at 64, temperature
  // 1: every reply whole and valid (the length budget). .parse() raises
  // LengthFinishReasonError on finish_reason "length" whatever the content; a reply the
  // budget shaped finishes "stop" (kvpd_shaped_by says the limit shaped it), so every one
  // must parse, and some of them must have been shaped for the test to mean anything.
  const { zodResponseFormat } = await import("openai/helpers/zod");
  const { z } = await import("zod");
  const person = z.object({ name: z.string(), tags: z.array(z.string()), n: z.number().int().min(0).max(9) });
  const rf = zodResponseFormat(person, "person");
  const counts = { parsed: 0, shaped: 0 };
  for (const mt of [32, 64])
    for (let i = 0; i < 20; i += 4)
      await Promise.all([0, 1, 2, 3].map(async (j) => {
        const req = { model: id, seed: 100 * mt + i + j, temperature: 1, max_tokens: mt, response_format: rf,
                      messages: [{ role: "user", content: `Person ${i + j}?` }] };
        let p;
        try {
          p = await client.chat.completions.parse(req);
        } catch (e) {
          throw new Error(`FAIL: clients/openai: .parse at ${mt} (seed ${req.seed}) raised ${e?.constructor?.name}: ${e.message}`);
        }
        const c = p.choices[0];
        check(c.finish_reason === "stop" && person.safeParse(c.message.parsed).success,
              `.parse at ${mt}: ${c.finish_reason}: ${c.message.content}`);
        counts.parsed++;
        counts.shaped += c.kvpd_shaped_by === "max_tokens";
      }));
  check(counts.parsed === 40, `.parse took every reply (${counts.parsed} of 40)`);
  check(counts.shaped > 0, `some of them were shaped by their limit (${counts.shaped})`);
  console.log(`clients/openai: .parse at max_tokens 32 and 64: ${counts.parsed} of 40 parsed and valid, ` +
              `${counts.shaped} of them shaped by the limit`);

  // The Responses API through the SDK's own stream helper (responses.stream and
  // finalResponse), which rebuilds the response from the events and throws on an event
  // out of order: plain text and a forced tool call. Every event's sequence_number is one
  // more than the last; the lifecycle comes in order (created, in_progress, then each
  // item added before its deltas and done, then completed or incomplete); the final
  // text is the deltas joined, and the final call's arguments are its deltas joined.
  const streamed = async (what, req) => {
    const s = client.responses.stream({ model: id, ...req });
    const types = [], seqs = [], deltas = [], argDeltas = [], open = new Set(), closed = new Set(), stray = [];
    for await (const ev of s) {
      types.push(ev.type);
      seqs.push(ev.sequence_number);
      if (ev.type === "response.output_item.added") open.add(ev.output_index);
      if (/\.delta$/.test(ev.type) && !(open.has(ev.output_index) && !closed.has(ev.output_index)))
        stray.push(`${ev.type} at ${ev.output_index}`);
      if (ev.type === "response.output_item.done") closed.add(ev.output_index);
      if (ev.type === "response.output_text.delta") deltas.push(ev.delta);
      if (ev.type === "response.function_call_arguments.delta") argDeltas.push(ev.delta);
    }
    const final = await s.finalResponse();
    check(seqs.every((n, i) => Number.isInteger(n) && n === (i ? seqs[i - 1] + 1 : seqs[0])),
          `${what}: sequence_number rises by one each event (${seqs.join(",")})`);
    check(types[0] === "response.created" && types[1] === "response.in_progress" &&
          /^response\.(completed|incomplete)$/.test(types[types.length - 1]),
          `${what}: created, in_progress first, completed last (${types.join(" ")})`);
    check(open.size > 0 && [...open].every((i) => closed.has(i)), `${what}: every item added is done`);
    check(stray.length === 0, `${what}: every delta belongs to an added, unfinished item (${stray.join(", ")})`);
    return { final, types, text: deltas.join(""), args: argDeltas.join("") };
  };
  const plain = await streamed("responses.stream, text", { input: "Hello", max_output_tokens: 24 });
  check(plain.text.length > 0 && plain.final.output_text === plain.text,
        `responses.stream, text: finalResponse's text is the deltas joined (${JSON.stringify(plain.text)})`);
  check(plain.types.includes("response.output_text.done") && plain.types.includes("response.content_part.done"),
        "responses.stream, text: the text part is done before the item");
  const rtools = [{ type: "function", name: "get_weather", description: "The weather in a city.",
                    parameters: tools[0].function.parameters, strict: true }];
  const called = await streamed("responses.stream, tool call", { input: "Weather in Oslo?", tools: rtools,
                                                                 tool_choice: "required", max_output_tokens: 256 });
  const fc = called.final.output.find((o) => o.type === "function_call");
  check(called.final.status === "completed" && fc && fc.name === "get_weather" && fc.call_id,
        `responses.stream, tool call: finalResponse holds the call (${JSON.stringify(fc)})`);
  check(fc.arguments === called.args && typeof JSON.parse(fc.arguments).city === "string",
        `responses.stream, tool call: the arguments are their deltas joined (${fc.arguments})`);
} finally {
  code = await stopKvpd(k, dir);
}
check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
