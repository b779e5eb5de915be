// The Vercel AI SDK (ai + @ai-sdk/openai-compatible, pinned in tests/clients) against
// kvpd on a synthetic model with Qwen3's tokenizer and template (random weights): a
// generateText chat turn, a forced tool call the SDK parses and validates against the
// tool's schema and then executes, and the tool result's step continuing the cached
// conversation; a named toolChoice; Output.object (with supportsStructuredOutputs) returning
// a parsed object; generateObject, Output.object and a forced tool 20 times each at
// maxOutputTokens 32 and at 64 with temperature 1 (the length budget; the counts printed).
//
//   KVP_BUILD=build node tests/clients/aisdk.mjs   (meson test --suite clients runs it)
import { checker, KEY, startKvpd, stopKvpd, synthQwen3 } from "../openai/lib.mjs";

const check = checker("clients/aisdk");
let ai, createOpenAICompatible;
try {
  ai = await import("ai");
  ({ createOpenAICompatible } = await import("@ai-sdk/openai-compatible"));
} catch (e) {
  console.error(`clients/aisdk: ai is not installed in tests/clients (run scripts/setup.sh): ${e.message}`);
  process.exit(1);
}

const { model, dir } = synthQwen3("kvp-clients-aisdk-");
const k = await startKvpd(model);
let code;
try {
  const baseURL = `http://127.0.0.1:${k.port}/v1`;
  const id = (await (await fetch(`${baseURL}/models`, { headers: { authorization: `Bearer ${KEY}` } })).json()).data[0].id;
  const provider = createOpenAICompatible({ name: "kvpd", baseURL, apiKey: KEY, includeUsage: true });
  const chat = await ai.generateText({ model: provider(id), prompt: "Hello", maxOutputTokens: 16, maxRetries: 0 });
  check(typeof chat.text === "string" && chat.usage.outputTokens > 0, `a chat turn answers (${chat.usage.outputTokens} tokens)`);
  let executed = null;
  const tools = {
    get_weather: ai.tool({
      description: "The weather in a city.",
      inputSchema: ai.jsonSchema({ type: "object", properties: { city: { type: "string", maxLength: 12 } },
                                   required: ["city"], additionalProperties: false }),
      execute: async (input) => {
        executed = input;
        return "sunny, 21 C";
      },
    }),
  };
  const r = await ai.generateText({ model: provider(id), prompt: "Weather in Oslo?", tools, toolChoice: "required",
                                    maxOutputTokens: 256, maxRetries: 0 });
  const call = r.toolCalls[0];
  check(call?.toolName === "get_weather" && typeof call.input.city === "string" && !call.invalid,
        `a tool call the SDK parsed: ${JSON.stringify(call?.input)}`);
  check(executed && executed.city === call.input.city, "the SDK executed the tool with those arguments");
  // the tool's result as the next step (the SDK sends the call and its result back)
  const r2 = await ai.generateText({ model: provider(id), tools, maxOutputTokens: 16, maxRetries: 0,
                                     messages: [{ role: "user", content: "Weather in Oslo?" }, ...r.response.messages] });
  const cached = r2.usage.inputTokenDetails?.cacheReadTokens ?? r2.usage.cachedInputTokens ?? 0;
  check(cached > 0, `the tool result's turn reuses the cache (${cached} of ${r2.usage.inputTokens} input tokens)`);
  // a named tool is always the one called
  const named = await ai.generateText({ model: provider(id), prompt: "Weather?", tools: { ...tools, other: tools.get_weather },
                                        toolChoice: { type: "tool", toolName: "other" }, maxOutputTokens: 256, maxRetries: 0 });
  check(named.toolCalls.length === 1 && named.toolCalls[0].toolName === "other", "toolChoice naming a tool calls it");
  // Output.object: the provider sends the schema as json_schema when it is told kvpd takes it
  const { z } = await import("zod");
  const person = z.object({ name: z.string().max(8), n: z.number().int().min(0).max(9) });
  const sp = createOpenAICompatible({ name: "kvpd", baseURL, apiKey: KEY, supportsStructuredOutputs: true });
  const o = await ai.generateText({ model: sp(id), prompt: "A person?", output: ai.Output.object({ schema: person }),
                                    maxOutputTokens: 256, maxRetries: 0 });
  check(person.safeParse(o.output).success, `Output.object returns a parsed object: ${JSON.stringify(o.output)}`);
  // generateObject, Output.object and a forced tool, 20 times each at maxOutputTokens 32
  // and at 64, temperature 1: every object and every call's input whole and valid (the
  // length budget), and none finishes "length": a reply the budget shaped is whole, so it
  // finishes "stop" (a forced call: "tool-calls").
  const loose = z.object({ name: z.string(), tags: z.array(z.string()), n: z.number().int().min(0).max(9) });
  const note = { note: ai.tool({ description: "A note.", inputSchema: loose, execute: async () => "ok" }) };
  const counts = { generateObject: 0, "Output.object": 0, tool: 0 };
  const helpers = {
    generateObject: async (mt, seed) => (await ai.generateObject({ model: sp(id), schema: loose, prompt: `Person ${seed}?`,
                                                                  maxOutputTokens: mt, temperature: 1, seed, maxRetries: 0 })),
    "Output.object": async (mt, seed) => {
      const r = await ai.generateText({ model: sp(id), prompt: `Person ${seed}?`, output: ai.Output.object({ schema: loose }),
                                        maxOutputTokens: mt, temperature: 1, seed, maxRetries: 0 });
      return { object: r.output, finishReason: r.finishReason };
    },
    tool: async (mt, seed) => {
      const r = await ai.generateText({ model: provider(id), prompt: `Note ${seed}?`, tools: note, toolChoice: "required",
                                        maxOutputTokens: mt, temperature: 1, seed, maxRetries: 0 });
      check(r.toolCalls.length === 1 && !r.toolCalls[0].invalid, `a forced call at ${mt}: ${JSON.stringify(r.toolCalls)}`);
      return { object: r.toolCalls[0].input, finishReason: r.finishReason };
    },
  };
  for (const [name, run] of Object.entries(helpers))
    for (const mt of [32, 64])
      for (let i = 0; i < 20; i += 4)
        await Promise.all([0, 1, 2, 3].map(async (j) => {
          const r = await run(mt, 100 * mt + i + j);
          check(loose.safeParse(r.object).success, `${name} at ${mt} (${r.finishReason}): ${JSON.stringify(r.object)}`);
          counts[name]++;
          check(r.finishReason !== "length", `${name} at ${mt}: a whole reply does not finish "length"`);
        }));
  console.log(`clients/aisdk: at maxOutputTokens 32 and 64, 40 each: ${JSON.stringify(counts)} parsed and valid`);
} finally {
  code = await stopKvpd(k, dir);
}
check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
