// Function tools and structured output over the Responses API, through the official
// `openai` SDK, on a qwen2-shaped synthetic with random weights carrying Qwen3's real
// tokenizer and template (Hermes <tool_call> format). The weights are random, so a
// parseable call with valid arguments comes from the forced-call grammar: tool_choice
// "required" and a named function give function_call output items whose arguments
// validate against the tool's parameters, whole and streamed (the stream's events in
// the Responses API's order); the call's output sent back, by previous_response_id or
// as the whole conversation of items, continues the cached conversation; a
// text.format json_schema reply validates against its schema; malformed items are
// refused naming the field.
//
//   KVP_BUILD=build node tests/openai/responses_tools.mjs   (meson test --suite openai runs it)
import { checker, KEY, startKvpd, stopKvpd, synthQwen3, validate } from "./lib.mjs";

const check = checker("responses_tools");

let OpenAI;
try {
  ({ default: OpenAI } = await import("openai"));
} catch (e) {
  console.error(`responses_tools: the SDK is not installed in tests/openai (run scripts/setup.sh): ${e.message}`);
  process.exit(1);
}

const params = {
  get_weather: {
    type: "object",
    properties: { city: { type: "string", minLength: 1, maxLength: 12 }, unit: { enum: ["c", "f"] } },
    required: ["city", "unit"],
    additionalProperties: false,
  },
  add: {
    type: "object",
    properties: { a: { type: "integer", minimum: -100, maximum: 100 }, b: { type: "integer", minimum: -100, maximum: 100 } },
    required: ["a", "b"],
    additionalProperties: false,
  },
};
// The Responses API's flat function tools.
const tools = Object.entries(params).map(([name, parameters]) => ({
  type: "function", name, description: `The ${name} tool.`, parameters, strict: true,
}));

// The function_call items of an output: one, naming a declared tool, arguments valid.
function oneCall(output, what, name) {
  const calls = output.filter((it) => it.type === "function_call");
  check(calls.length === 1, `${what}: one function_call item (${JSON.stringify(output)})`);
  const c = calls[0];
  check(typeof c.call_id === "string" && c.call_id.length > 0 && c.id.startsWith("fc_") &&
        c.status === "completed", `${what}: the item has an id, a call_id and status completed`);
  check(params[c.name] !== undefined && (!name || c.name === name), `${what}: names ${name || "a declared tool"} (${c.name})`);
  let args;
  try {
    args = JSON.parse(c.arguments);
  } catch (e) {
    throw new Error(`FAIL: ${what}: the arguments are not JSON: ${e.message}: ${JSON.stringify(c.arguments)}`);
  }
  const errs = validate(params[c.name], args);
  check(errs.length === 0, `${what}: ${c.name}(${c.arguments}) validates` + (errs.length ? `: ${errs.join("; ")}` : ""));
  return c;
}

async function main() {
  const { model, dir } = synthQwen3("kvp-resptools-");
  const k = await startKvpd(model);
  let code = null;
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const id = (await client.models.list()).data[0].id;
    const ask = (i, extra = {}) => client.responses.create({
      model: id, temperature: 1, seed: 3000 + i, max_output_tokens: 1024, tools,
      tool_choice: "required", input: `Do task number ${i}.`, ...extra });

    // whole: tool_choice required
    const names = new Set();
    for (let i = 0; i < 6; i++) {
      const r = await ask(i);
      check(r.status === "completed", `required ${i}: completed (${r.status})`);
      names.add(oneCall(r.output, `required ${i}`).name);
      check(r.tools.length === 2 && r.tools[0].name === "get_weather", `required ${i}: the response echoes the tools`);
    }
    check(names.size >= 1, `the calls named ${[...names].join(", ")}`);

    // streamed: a named function; the events in order
    const stream = await ask(10, { tool_choice: { type: "function", name: "add" }, stream: true });
    const types = [];
    let args = "", final = null, addedCall = null;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "response.output_item.added" && ev.item.type === "function_call") addedCall = ev.item;
      if (ev.type === "response.function_call_arguments.delta") args += ev.delta;
      if (ev.type === "response.completed") final = ev.response;
    }
    check(types[0] === "response.created" && types[1] === "response.in_progress", `the stream opens: ${types.slice(0, 2)}`);
    const want = ["response.output_item.added", "response.function_call_arguments.delta",
                  "response.function_call_arguments.done", "response.output_item.done", "response.completed"];
    check(JSON.stringify(types.slice(-5)) === JSON.stringify(want), `the call's events in order: ${types.join(",")}`);
    check(addedCall && addedCall.name === "add" && addedCall.status === "in_progress", "the call item is added first, in progress");
    const sc = oneCall(final.output, "streamed named add", "add");
    check(sc.arguments === args, `the streamed arguments are the final item's (${args})`);
    check(final.tool_choice.type === "function" && final.tool_choice.name === "add", "the response echoes tool_choice");

    // the call's output continues the stored conversation (previous_response_id)
    const first = await ask(20);
    const call = oneCall(first.output, "a call to answer");
    const next = await client.responses.create({
      model: id, seed: 1, max_output_tokens: 16, tools, tool_choice: "none", previous_response_id: first.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "done" }] });
    check(next.status === "completed" || next.status === "incomplete", `the tool result is served (${next.status})`);
    check(next.output.every((it) => it.type === "message"), "tool_choice none: no call");
    const had = first.usage.input_tokens + first.usage.output_tokens;
    const cached = next.usage.input_tokens_details.cached_tokens;
    check(cached >= had - 2, `the tool result continues the cached conversation (${cached} cached of the ${had} the first turn held)`);

    // the same conversation sent whole as items (store: false, as stateless agents do)
    const whole = await client.responses.create({
      model: id, seed: 1, max_output_tokens: 16, tools, tool_choice: "none", store: false,
      input: [{ role: "user", content: "Do task number 20." },
              { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments },
              { type: "function_call_output", call_id: call.call_id, output: "done" }] });
    check(whole.output.every((it) => it.type === "message") && whole.usage.input_tokens > 0,
          "a conversation of items with a call and its output is served");
    try {
      await client.responses.retrieve(whole.id);
      throw new Error("FAIL: a store:false response was stored");
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError, "store:false keeps nothing");
    }

    // text.format json_schema: the reply validates against the schema
    const schema = { type: "object", properties: { n: { type: "integer", minimum: 0, maximum: 9 }, ok: { type: "boolean" } },
                     required: ["n", "ok"], additionalProperties: false };
    const js = await client.responses.create({ model: id, seed: 5, temperature: 1, max_output_tokens: 256, input: "Give n.",
                                               text: { format: { type: "json_schema", name: "nok", schema, strict: true } } });
    check(js.status === "completed", `json_schema reply completed (${js.status})`);
    const v = JSON.parse(js.output_text);
    check(validate(schema, v).length === 0, `the json_schema reply validates: ${js.output_text}`);

    // refusals: 400s naming the field; the daemon keeps serving
    const refused = async (extra, what, param) => {
      try {
        await ask(0, { max_output_tokens: 8, ...extra });
      } catch (e) {
        check(e instanceof OpenAI.BadRequestError && e.param === param, `${what}: 400 naming ${param} (${e.param}): ${e.message}`);
        return;
      }
      throw new Error(`FAIL: ${what} was accepted`);
    };
    await refused({ input: [{ type: "function_call_output", call_id: "call_nope", output: "x" }] },
                  "an output naming no call", "input[0].call_id");
    await refused({ input: [{ role: "user", content: "x" }, { type: "function_call", call_id: "c1", name: "add" }] },
                  "a call without arguments", "input[1].arguments");
    await refused({ input: [{ type: "item_reference", id: "x" }] }, "an item reference", "input[0].type");
    await refused({ input: [{ type: "reasoning", summary: [], content: [{ type: "output_text", text: "x" }] }] },
                  "a reasoning item without reasoning_text", "input[0].content");
    await refused({ tool_choice: { type: "file_search" } }, "a hosted tool_choice", "tool_choice");
    await refused({ tools: [{ type: "function" }] }, "a function tool without a name", "tools[0].name");
    await refused({ tool_choice: { type: "function", name: "nope" } }, "a named function not declared", "tool_choice");
    await refused({ parallel_tool_calls: "no" }, "parallel_tool_calls not a boolean", "parallel_tool_calls");

    // parallel_tool_calls: accepted as a boolean, echoed; false gives at most one call
    for (const par of [false, true]) {
      const pr = await ask(40, { tool_choice: "auto", parallel_tool_calls: par, max_output_tokens: 64 });
      check(pr.parallel_tool_calls === par, `parallel_tool_calls ${par} is echoed (${pr.parallel_tool_calls})`);
      check(par || pr.output.filter((it) => it.type === "function_call").length <= 1,
            `parallel_tool_calls false: at most one call (${pr.output.map((it) => it.type)})`);
      const cr = await client.chat.completions.create({ model: id, seed: 40, max_tokens: 64, parallel_tool_calls: par,
        tools: tools.map(({ type, ...f }) => ({ type, function: f })), messages: [{ role: "user", content: "Do task 40." }] });
      check(par || (cr.choices[0].message.tool_calls ?? []).length <= 1,
            `chat completions, parallel_tool_calls false: at most one call (${cr.choices[0].finish_reason})`);
    }
    try {
      await client.chat.completions.create({ model: id, max_tokens: 4, parallel_tool_calls: 1,
        tools: tools.map(({ type, ...f }) => ({ type, function: f })), messages: [{ role: "user", content: "x" }] });
      throw new Error("FAIL: chat completions took parallel_tool_calls 1");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.param === "parallel_tool_calls",
            `chat completions: parallel_tool_calls 1 is 400 naming it (${e.param})`);
    }
    oneCall((await ask(30)).output, "after the refusals");
  } finally {
    code = await stopKvpd(k, dir);
  }
  check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
}

main().then(() => console.log("responses_tools: all passed"), (e) => {
  console.error(`responses_tools: ${e.stack || e}`);
  process.exit(1);
});
