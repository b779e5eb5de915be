// LangChain's ChatOpenAI (@langchain/openai, pinned in tests/clients) against kvpd on a
// synthetic model with Qwen3's tokenizer and template (random weights): a chat turn,
// bindTools with a forced call (LangChain parses it into tool_calls), and the tool
// result (a ToolMessage) continuing the cached conversation; withStructuredOutput
// (json_schema, and functionCalling) returning parsed objects, each also 20 times at
// maxTokens 32 and at 64 with temperature 1 (the length budget; the counts printed).
//
//   KVP_BUILD=build node tests/clients/langchain.mjs   (meson test --suite clients runs it)
import { checker, KEY, startKvpd, stopKvpd, synthQwen3 } from "../openai/lib.mjs";

const check = checker("clients/langchain");
let ChatOpenAI, ToolMessage, HumanMessage;
try {
  ({ ChatOpenAI } = await import("@langchain/openai"));
  ({ ToolMessage, HumanMessage } = await import("@langchain/core/messages"));
} catch (e) {
  console.error(`clients/langchain: @langchain/openai is not installed in tests/clients (run scripts/setup.sh): ${e.message}`);
  process.exit(1);
}

const weather = { type: "function", function: { name: "get_weather", description: "The weather in a city.",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"],
                additionalProperties: false } } };

const { model, dir } = synthQwen3("kvp-clients-langchain-");
const k = await startKvpd(model);
let code;
try {
  const baseURL = `http://127.0.0.1:${k.port}/v1`;
  const id = (await (await fetch(`${baseURL}/models`, { headers: { authorization: `Bearer ${KEY}` } })).json()).data[0].id;
  const llm = new ChatOpenAI({ model: id, apiKey: KEY, configuration: { baseURL }, maxTokens: 16, maxRetries: 0 });
  const chat = await llm.invoke("Hello");
  check(typeof chat.content === "string", `a chat turn answers: ${JSON.stringify(chat.content)}`);
  const withTools = new ChatOpenAI({ model: id, apiKey: KEY, configuration: { baseURL }, maxTokens: 256, maxRetries: 0 })
    .bindTools([weather], { tool_choice: "required" });
  const q = new HumanMessage("Weather in Oslo?");
  const m = await withTools.invoke([q]);
  const call = m.tool_calls?.[0];
  check(call?.name === "get_weather" && typeof call.args.city === "string" && (m.invalid_tool_calls || []).length === 0,
        `bindTools: LangChain parsed the call: ${JSON.stringify(call)}`);
  const llm2 = new ChatOpenAI({ model: id, apiKey: KEY, configuration: { baseURL }, maxTokens: 16, maxRetries: 0 })
    .bindTools([weather]);
  const r2 = await llm2.invoke([q, m, new ToolMessage({ tool_call_id: call.id, content: "sunny, 21 C" })]);
  const cached = r2.usage_metadata?.input_token_details?.cache_read ?? 0;
  check(cached > 0, `the ToolMessage turn reuses the cache (${cached} of ${r2.usage_metadata?.input_tokens} input tokens)`);
  // withStructuredOutput: json_schema (the default) and a forced named call
  const { z } = await import("zod");
  const person = z.object({ name: z.string().max(8), n: z.number().int().min(0).max(9) });
  const big = new ChatOpenAI({ model: id, apiKey: KEY, configuration: { baseURL }, maxTokens: 256, maxRetries: 0 });
  for (const method of [undefined, "functionCalling"]) {
    const o = await big.withStructuredOutput(person, method ? { method } : undefined).invoke("A person?");
    check(person.safeParse(o).success, `withStructuredOutput (${method || "default"}) returns a parsed object: ${JSON.stringify(o)}`);
  }
  // withStructuredOutput (its default method, json_schema, and functionCalling) 20 times at
  // maxTokens 32 and at 64, temperature 1: every reply whole and valid (the length budget).
  // The default method parses with the openai SDK, which raises LengthFinishReasonError on
  // finish_reason "length" whatever the content; a reply the budget shaped finishes "stop"
  // (with kvpd_shaped_by), so all 40 must parse. The same requests sent plainly count the
  // shaped ones: some must be, for the test to mean anything.
  const loose = z.object({ name: z.string(), tags: z.array(z.string()), n: z.number().int().min(0).max(9) });
  const plain = async (mt, seed, content) => {
    const res = await fetch(`${baseURL}/chat/completions`, {
      method: "POST", headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: id, seed, temperature: 1, max_tokens: mt, messages: [{ role: "user", content }],
                             response_format: { type: "json_schema", json_schema: { name: "extract", schema: z.toJSONSchema(loose) } } }) });
    const r = await res.json();
    return { finish: r.choices[0].finish_reason, shaped: r.choices[0].kvpd_shaped_by, text: r.choices[0].message.content };
  };
  const counts = { default: 0, functionCalling: 0, shaped: 0 };
  for (const method of [undefined, "functionCalling"])
    for (const mt of [32, 64])
      for (let i = 0; i < 20; i += 4)
        await Promise.all([0, 1, 2, 3].map(async (j) => {
          const llm = new ChatOpenAI({ model: id, apiKey: KEY, configuration: { baseURL }, maxTokens: mt,
                                       temperature: 1, maxRetries: 0, modelKwargs: { seed: 100 * mt + i + j } });
          const what = method || "default";
          let o;
          try {
            o = await llm.withStructuredOutput(loose, method ? { method } : undefined).invoke(`Person ${i + j}?`);
          } catch (e) {
            throw new Error(`FAIL: clients/langchain: withStructuredOutput (${what}) at ${mt} raised ` +
                            `${e?.constructor?.name}: ${e.message}`);
          }
          check(loose.safeParse(o).success, `withStructuredOutput (${what}) at ${mt}: ${JSON.stringify(o)}`);
          counts[what]++;
          if (!method) {
            const r = await plain(mt, 100 * mt + i + j, `Person ${i + j}?`);
            check(r.finish === "stop" && loose.safeParse(JSON.parse(r.text)).success,
                  `the same request sent plainly at ${mt}: whole, valid, "stop" (${r.finish}): ${r.text}`);
            counts.shaped += r.shaped === "max_tokens";
          }
        }));
  check(counts.default === 40 && counts.functionCalling === 40,
        `withStructuredOutput parsed every reply (${JSON.stringify(counts)})`);
  check(counts.shaped > 0, `some default-method replies were shaped by their limit (${counts.shaped})`);
  console.log(`clients/langchain: withStructuredOutput at maxTokens 32 and 64, 40 each: ${JSON.stringify(counts)} ` +
              "(parsed and valid; shaped: default-method replies the limit shaped)");
} finally {
  code = await stopKvpd(k, dir);
}
check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
