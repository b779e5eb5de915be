// The OpenAI Agents SDK (@openai/agents, pinned in tests/clients) on its Chat Completions
// model and on its default Responses model, each against kvpd on a synthetic model with
// Qwen3's tokenizer and template (random weights): an agent's chat turn, and an agent whose first turn must call its tool (the
// SDK runs it and sends the result back, the turn reusing the call's cache, and the run
// then finishes with the model's text); on the Responses model three turns of a
// conversation with that agent (history sent back, then previousResponseId); outputType
// returning a parsed object, also 20 times at maxTokens 32 and at 64 with temperature 1
// (the length budget); a handoff.
//
//   KVP_BUILD=build node tests/clients/agents.mjs   (meson test --suite clients runs it)
import { checker, KEY, startKvpd, stopKvpd, synthQwen3 } from "../openai/lib.mjs";

const checkAll = checker("clients/agents");
const check = checkAll;
let A, OpenAI;
try {
  A = await import("@openai/agents");
  ({ default: OpenAI } = await import("openai"));
} catch (e) {
  console.error(`clients/agents: @openai/agents is not installed in tests/clients (run scripts/setup.sh): ${e.message}`);
  process.exit(1);
}
A.setTracingDisabled(true);

const { model, dir } = synthQwen3("kvp-clients-agents-");
const k = await startKvpd(model);
let code;
try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
  const id = (await client.models.list()).data[0].id;
  const models = [["chat completions", new A.OpenAIChatCompletionsModel(client, id)],
                  ["responses", new A.OpenAIResponsesModel(client, id)]];
  for (const [api, m] of models) {
    const check = (ok, msg) => checkAll(ok, `${api}: ${msg}`);
    // The SDK's Responses model treats a reply cut by max_output_tokens ("incomplete") as
    // a failed run; random weights rarely end a reply, so its free-text turns end at a
    // stop string (kvpd's `stop`, sent as provider data) and the tool agent's final turn
    // is a typed output, which its grammar always closes.
    const { z } = await import("zod");
    const person = z.object({ name: z.string().max(8), n: z.number().int().min(0).max(9) });
    const responses = api === "responses";
    const free = responses ? { maxTokens: 64, providerData: { stop: [" "] } } : { maxTokens: 16 };
    const chatAgent = new A.Agent({ name: "chat", instructions: "Be brief.", model: m, modelSettings: free });
    const chat = await A.run(chatAgent, "Hello");
    check(typeof chat.finalOutput === "string", `an agent's chat turn answers: ${JSON.stringify(chat.finalOutput)}`);
    let executed = null;
    const weather = A.tool({
      name: "get_weather",
      description: "The weather in a city.",
      parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"],
                    additionalProperties: false },
      strict: true,
      execute: async (input) => {
        executed = input;
        return "sunny, 21 C";
      },
    });
    const agent = new A.Agent({ name: "weather", instructions: "Use the tool.", model: m, tools: [weather],
                                ...(responses ? { outputType: person } : {}),
                                modelSettings: { toolChoice: "required", maxTokens: 256 } });
    const r = await A.run(agent, "Weather in Oslo?", { maxTurns: 4 });
    check(executed && typeof executed.city === "string", `the SDK ran the tool: ${JSON.stringify(executed)}`);
    const items = r.newItems.map((i) => i.type);
    check(items.includes("tool_call_item") && items.includes("tool_call_output_item"),
          `the run holds the call and its output (${items.join(", ")})`);
    // the tool result's model call continues the session that made the call
    const second = r.rawResponses[1]?.usage;
    const cached = second?.inputTokensDetails?.[0]?.cached_tokens ?? 0;
    check(r.rawResponses.length >= 2 && cached > 0,
          `the tool result's turn reuses the cache (${cached} of ${second?.inputTokens} input tokens)`);
    check(responses ? person.safeParse(r.finalOutput).success : typeof r.finalOutput === "string",
          `the run finishes after the tool's result: ${JSON.stringify(r.finalOutput)}`);
    // Three turns of a conversation with that agent (the Responses model: the API the SDK
    // uses by default), each a run that calls the tool and then finishes with its typed
    // output: the second run sends the first's whole history back with the next user
    // message; over the Responses API the third continues the second's stored response
    // (previousResponseId), over chat completions it sends the history too.
    if (responses) {
      let convo = r, calls = 0;
      for (const [turn, city] of [[2, "Bergen"], [3, "Tromso"]]) {
        executed = null;
        const input = turn === 3 ? `And ${city}?` : [...convo.history, { role: "user", content: `And ${city}?` }];
        const opts = { maxTurns: 4, ...(turn === 3 ? { previousResponseId: convo.lastResponseId } : {}) };
        let next;
        try {
          next = await A.run(agent, input, opts);
        } catch (e) {
          throw new Error(`FAIL: ${api}: turn ${turn} of the conversation failed: ${e.message}`);
        }
        calls += executed !== null;
        const used = next.rawResponses[0]?.usage;
        const hit = used?.inputTokensDetails?.[0]?.cached_tokens ?? 0;
        check(executed && person.safeParse(next.finalOutput).success && hit > 0,
              `turn ${turn}: the tool ran, the run finished typed, the cache reused (${hit} of ` +
              `${used?.inputTokens}): ${JSON.stringify(next.finalOutput)}`);
        convo = next;
      }
      check(calls === 2, `three turns, each with its tool call (${calls + 1} calls run)`);
    }
    // outputType: the run's final output is the parsed object
    const typed = await A.run(new A.Agent({ name: "typed", model: m, outputType: person, modelSettings: { maxTokens: 256 } }),
                              "A person?");
    check(person.safeParse(typed.finalOutput).success, `outputType returns a parsed object: ${JSON.stringify(typed.finalOutput)}`);
    // a handoff: the forced transfer call moves the run to the other agent
    const target = new A.Agent({ name: "target", instructions: "Be brief.", model: m, modelSettings: free });
    const front = new A.Agent({ name: "front", model: m, handoffs: [target],
                                modelSettings: { toolChoice: "required", maxTokens: 256 } });
    const h = await A.run(front, "Pass me on.", { maxTurns: 4 });
    check(h.lastAgent.name === "target", `the handoff moved the run to ${h.lastAgent.name}`);
    // outputType 20 times at maxTokens 32 and at 64, temperature 1: every final output
    // whole and valid (the length budget).
    const loose = z.object({ name: z.string(), tags: z.array(z.string()), n: z.number().int().min(0).max(9) });
    // The Responses model fails a run whose reply is "incomplete" whatever its content; a
    // reply the budget shaped is "completed" (with kvpd_shaped_by), so every run must
    // finish. Its raw response tells the shaped ones: some must be, for the test to mean
    // anything.
    const counts = { ok: 0, shaped: 0 };
    for (const mt of [32, 64])
      for (let i = 0; i < 20; i += 4)
        await Promise.all([0, 1, 2, 3].map(async (j) => {
          const seed = 100 * mt + i + j;
          const a = new A.Agent({ name: "typed", model: m, outputType: loose,
                                  modelSettings: { maxTokens: mt, temperature: 1, providerData: { seed } } });
          let res;
          try {
            res = await A.run(a, `Person ${i + j}?`);
          } catch (e) {
            throw new Error(`FAIL: ${api}: outputType at ${mt} (seed ${seed}): the run failed: ${e.message}`);
          }
          check(loose.safeParse(res.finalOutput).success, `outputType at ${mt}: ${JSON.stringify(res.finalOutput)}`);
          counts.ok++;
          const raw = res.rawResponses[0]?.providerData;
          counts.shaped += raw?.kvpd_shaped_by === "max_output_tokens";
        }));
    check(counts.ok === 40, `outputType: every run finished parsed and valid (${counts.ok} of 40)`);
    // (the Chat Completions model keeps no raw response to tell them by)
    check(!responses || counts.shaped > 0, `some runs were shaped by their limit (${counts.shaped})`);
    console.log(`clients/agents: ${api}: outputType at maxTokens 32 and 64, 40 runs: ${counts.ok} parsed and valid, ` +
                `${counts.shaped} of them shaped by the limit (as the raw response shows it)`);
  }
} finally {
  code = await stopKvpd(k, dir);
}
check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
