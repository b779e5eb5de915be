// Forced tool calls through the official `openai` SDK: tool_choice "required" and a named
// function on a qwen2-shaped synthetic model with random weights carrying Qwen3's real
// tokenizer and template (Hermes <tool_call> format). The weights are random, so every
// parseable call with valid arguments comes from the forced-call grammar alone: 20 plain
// and 20 streamed "required" replies over three tools each hold one call naming a
// declared tool with arguments that validate against its parameters; a named function is
// always the one called, also with a response_format (which shapes text replies only). A
// forced tool whose parameters schema kvpd cannot compile gets a 400 naming the field.
// The other formats' frames too: Llama 3.1's tokenizer and template (a bare JSON call with "parameters") and
// Mistral Nemo's ([TOOL_CALLS][...]), plain and streamed.
//
//   KVP_BUILD=build node tests/openai/toolcalls.mjs   (meson test --suite openai runs it)
import { checker, KEY, startKvpd, stopKvpd, synthModel, synthQwen3, validate } from "./lib.mjs";

const check = checker("toolcalls");

let OpenAI;
try {
  ({ default: OpenAI } = await import("openai"));
} catch (e) {
  console.error(`toolcalls: the SDK is not installed in tests/openai (run scripts/setup.sh): ${e.message}`);
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
  set_alarm: {
    type: "object",
    properties: {
      time: {
        type: "object",
        properties: { h: { type: "integer", minimum: 0, maximum: 23 }, m: { type: "integer", minimum: 0, maximum: 59 } },
        required: ["h", "m"],
        additionalProperties: false,
      },
      label: { type: "string", maxLength: 8 },
      days: { type: "array", items: { enum: ["mon", "tue", "wed"] }, maxItems: 3 },
      loud: { type: "boolean" },
    },
    required: ["time", "loud"],
    additionalProperties: false,
  },
};
const tools = Object.entries(params).map(([name, parameters]) => ({
  type: "function", function: { name, description: `The ${name} tool.`, parameters },
}));

check(validate(params.set_alarm, { time: { h: 24 }, label: "123456789", days: ["sun"], x: 1 }).length >= 5,
      "the test's validator refuses invalid arguments");

// The one call of a reply: its name and parsed arguments validate, else it throws.
function oneCall(calls, what) {
  check(Array.isArray(calls) && calls.length === 1, `${what}: one call (${JSON.stringify(calls)})`);
  const c = calls[0];
  check(typeof c.id === "string" && c.id.startsWith("call_") && c.type === "function", `${what}: an id and type`);
  const p = params[c.function.name];
  check(p !== undefined, `${what}: names a declared tool (${c.function.name})`);
  let args;
  try {
    args = JSON.parse(c.function.arguments);
  } catch (e) {
    throw new Error(`FAIL: ${what}: the arguments are not JSON: ${e.message}: ${JSON.stringify(c.function.arguments)}`);
  }
  const errs = validate(p, args);
  check(errs.length === 0, `${what}: ${c.function.name}(${c.function.arguments}) validates` +
        (errs.length ? `: ${errs.join("; ")}` : ""));
  return c;
}

// A streamed reply's delta.tool_calls joined by index, and its finish_reason.
async function collect(stream) {
  const calls = [];
  let finish = null, content = "";
  for await (const ch of stream) {
    const choice = ch.choices[0];
    if (!choice) continue;
    finish = choice.finish_reason || finish;
    content += choice.delta?.content || "";
    for (const d of choice.delta?.tool_calls || []) {
      const c = calls[d.index] || (calls[d.index] = { id: "", type: "", function: { name: "", arguments: "" } });
      if (d.id) c.id = d.id;
      if (d.type) c.type = d.type;
      if (d.function?.name) c.function.name += d.function.name;
      if (d.function?.arguments) c.function.arguments += d.function.arguments;
    }
  }
  return { calls, finish, content };
}

async function main() {
  const { model, dir } = synthQwen3("kvp-toolcalls-");
  const k = await startKvpd(model);
  let code = null;
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const id = (await client.models.list()).data[0].id;
    const ask = (i, extra = {}) => client.chat.completions.create({
      model: id, seed: 2000 + i, temperature: 1, max_tokens: 1024, tools, tool_choice: "required",
      messages: [{ role: "user", content: `Do task number ${i}.` }], ...extra });

    // 20 plain, four at a time
    const names = new Set(), texts = new Set();
    for (let i = 0; i < 20; i += 4) {
      const rs = await Promise.all([0, 1, 2, 3].map((j) => ask(i + j)));
      rs.forEach((r, j) => {
        const what = `required reply ${i + j}`;
        check(r.choices[0].finish_reason === "tool_calls", `${what}: finish_reason tool_calls (${r.choices[0].finish_reason})`);
        const c = oneCall(r.choices[0].message.tool_calls, what);
        names.add(c.function.name);
        texts.add(c.function.arguments);
      });
    }
    check(names.size >= 2, `the required calls name more than one tool (${[...names].join(", ")}): the model chose`);
    check(texts.size > 10, `the arguments differ (${texts.size} distinct): the seeds drew them`);

    // 20 streamed
    for (let i = 0; i < 20; i += 4) {
      const rs = await Promise.all([0, 1, 2, 3].map(async (j) => collect(await ask(100 + i + j, { stream: true }))));
      rs.forEach((r, j) => {
        const what = `streamed required reply ${i + j}`;
        check(r.finish === "tool_calls", `${what}: finish_reason tool_calls (${r.finish})`);
        check(r.content === "", `${what}: no content (${JSON.stringify(r.content)})`);
        oneCall(r.calls, what);
      });
    }

    // a named function is always the one called
    for (const name of ["add", "set_alarm"]) {
      for (let i = 0; i < 3; i++) {
        const choice = { type: "function", function: { name } };
        const r = await ask(300 + i, { tool_choice: choice });
        const c = oneCall(r.choices[0].message.tool_calls, `named ${name} ${i}`);
        check(c.function.name === name && r.choices[0].finish_reason === "tool_calls", `named ${name} ${i}: ${name} is called`);
        const s = await collect(await ask(400 + i, { tool_choice: choice, stream: true }));
        const sc = oneCall(s.calls, `streamed named ${name} ${i}`);
        check(sc.function.name === name && s.finish === "tool_calls", `streamed named ${name} ${i}: ${name} is called`);
      }
    }

    // a forced call's result continues the conversation
    const first = await ask(500);
    const call = oneCall(first.choices[0].message.tool_calls, "a call to answer");
    const next = await client.chat.completions.create({
      model: id, seed: 1, max_tokens: 16, tools, tool_choice: "none",
      messages: [{ role: "user", content: "Do task number 500." }, first.choices[0].message,
                 { role: "tool", tool_call_id: call.id, content: "done" }] });
    // the grammar writes the call's frame as kvpd renders a call sent back, so the whole
    // reply is reused (all but the turn's last token, which the next prefill rewrites)
    const cached = next.usage.prompt_tokens_details?.cached_tokens ?? 0;
    const had = first.usage.prompt_tokens + first.usage.completion_tokens;
    check(next.choices[0].finish_reason !== "tool_calls" && cached >= had - 2,
          `the tool result continues the cached conversation, the call included (${cached} cached of the ${had} tokens the first turn held)`);

    // refusals: 400s naming the field; the daemon keeps serving
    const refused = async (extra, what, param, pattern) => {
      try {
        await ask(0, { max_tokens: 8, ...extra });
      } catch (e) {
        check(e instanceof OpenAI.BadRequestError && e.param === param && pattern.test(e.message),
              `${what}: 400 naming ${param}: ${e.message}`);
        return;
      }
      throw new Error(`FAIL: ${what} was accepted`);
    };
    // response_format shapes text replies: with a forced call the reply is still the call
    const rf = { type: "json_schema", json_schema: { name: "t", schema: { type: "object" } } };
    const withRf = await ask(600, { response_format: rf });
    check(withRf.choices[0].finish_reason === "tool_calls", "response_format with tool_choice required: a call");
    oneCall(withRf.choices[0].message.tool_calls, "response_format with tool_choice required");
    const named = await ask(601, { response_format: { type: "json_object" }, tool_choice: { type: "function", function: { name: "add" } } });
    check(oneCall(named.choices[0].message.tool_calls, "response_format with a named function").function.name === "add",
          "response_format with a named function: that function is called");
    const badTools = [...tools, { type: "function", function: { name: "when", parameters: {
      type: "object", properties: { at: { type: "string", format: "date-time" } } } } }];
    await refused({ tools: badTools }, "required over a tool with an unsupported keyword", "tools",
                  /format is not supported at \/when\/properties\/at/);
    await refused({ tools: badTools, tool_choice: { type: "function", function: { name: "when" } } },
                  "the named tool has an unsupported keyword", "tools", /format is not supported/);
    const big = { type: "object", properties: Object.fromEntries(
      Array.from({ length: 6000 }, (_, i) => [`p${i}`, { type: "string" }])) };
    check(JSON.stringify(big).length > 65536, "the big parameters schema is over 64 KB");
    await refused({ tools: [{ type: "function", function: { name: "big", parameters: big } }] },
                  "a forced tool whose parameters are over the size bound", "tools", /over the limit of 65536/);
    await refused({ tool_choice: { type: "function", function: { name: "nope" } } }, "a named function not declared",
                  "tool_choice", /does not declare/);
    // not forced, the same tool is only rendered: kvpd does not compile its schema
    const free = await ask(7, { tools: badTools, tool_choice: "auto", max_tokens: 8 });
    check(free.choices[0].finish_reason !== undefined, "tool_choice auto over the same tools is served");
    oneCall((await ask(8)).choices[0].message.tool_calls, "after the refusals");
  } finally {
    code = await stopKvpd(k, dir);
  }
  check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
}

// A forced call in another format: plain and streamed "required" replies and a named
// function, each one valid call.
async function otherFormat(name) {
  const { model, dir } = synthModel(name, "llama", `kvp-toolcalls-${name}-`);
  const k = await startKvpd(model);
  let code = null;
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const id = (await client.models.list()).data[0].id;
    const ask = (i, extra = {}) => client.chat.completions.create({
      model: id, seed: 3000 + i, temperature: 1, max_tokens: 1024, tools, tool_choice: "required",
      messages: [{ role: "user", content: `Do task number ${i}.` }], ...extra });
    for (let i = 0; i < 4; i++) {
      const r = await ask(i);
      check(r.choices[0].finish_reason === "tool_calls", `${name} required ${i}: finish_reason tool_calls`);
      oneCall(r.choices[0].message.tool_calls, `${name} required ${i}`);
      const s = await collect(await ask(10 + i, { stream: true }));
      check(s.finish === "tool_calls", `${name} streamed required ${i}: finish_reason tool_calls`);
      oneCall(s.calls, `${name} streamed required ${i}`);
    }
    const r = await ask(20, { tool_choice: { type: "function", function: { name: "set_alarm" } } });
    check(oneCall(r.choices[0].message.tool_calls, `${name} named`).function.name === "set_alarm", `${name}: the named function is called`);
  } finally {
    code = await stopKvpd(k, dir);
  }
  check(code === 0, `${name}: kvpd exited 0 on SIGTERM (${code})`);
}

await main();
await otherFormat("llama3_1");
await otherFormat("mistral_nemo");
