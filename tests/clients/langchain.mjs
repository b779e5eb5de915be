// LangChain's ChatOpenAI (@langchain/openai, pinned in tests/clients) against kvpd on a
// synthetic model with Qwen3's tokenizer and template (random weights): a chat turn,
// bindTools with a forced call (LangChain parses it into tool_calls), and the tool
// result (a ToolMessage) continuing the cached conversation; withStructuredOutput
// (json_schema, and functionCalling) returning parsed objects.
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
} finally {
  code = await stopKvpd(k, dir);
}
check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
