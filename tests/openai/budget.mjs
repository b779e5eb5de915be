// The length budget of constrained replies through the official `openai` SDK, on the
// qwen2-shaped synthetic with Qwen3's tokenizer and template (random weights: every valid
// reply comes from the constraint): response_format json_object and json_schema (a plain
// schema and one built to need many bytes: nested objects with long required keys) at
// max_tokens 16 to 64 and forced tool calls (tool_choice "required" and a named function)
// at 24 to 64, with temperature 1 over many seeds. Every reply parses and validates and says
// finish_reason "stop" (the document is whole), one the limit shaped with kvpd_shaped_by
// "max_tokens"; a forced call always comes back as tool_calls with arguments that validate
// and no markup in content. An unconstrained reply cut at max_tokens still says "length". A max_tokens below the schema's
// shortest document gets a 400 naming max_tokens, and the daemon keeps serving.
//
//   KVP_BUILD=build node tests/openai/budget.mjs   (meson test --suite openai runs it)
import { checker, importOpenAI, KEY, startKvpd, stopKvpd, synthQwen3, validate } from "./lib.mjs";

const check = checker("budget");
const OpenAI = await importOpenAI("budget");

const person = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 40 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    tags: { type: "array", items: { type: "string" }, maxItems: 5 },
    ok: { type: "boolean" },
  },
  required: ["name", "age", "ok"],
  additionalProperties: false,
};
// Three objects deep, each with a required key of 8 bytes: 61 bytes at least.
const deep = (() => {
  let s = { type: "string", minLength: 2 };
  for (let d = 0; d < 3; d++) {
    const key = `long_k${d}_`;
    s = { type: "object", properties: { [key]: s, n: { type: "integer" } }, required: [key, "n"],
          additionalProperties: false };
  }
  return s;
})();
const params = {
  get_weather: {
    type: "object",
    properties: { city: { type: "string" }, unit: { enum: ["celsius", "fahrenheit"] } },
    required: ["city", "unit"],
    additionalProperties: false,
  },
  note: {
    type: "object",
    properties: { text: { type: "string" }, tags: { type: "array", items: { type: "string" } } },
    required: ["text"],
  },
};
const tools = Object.entries(params).map(([name, parameters]) => ({
  type: "function", function: { name, description: `The ${name} tool.`, parameters },
}));

// The length budget counts a byte as a token (every byte has one), so a schema fits a
// max_tokens no smaller than its shortest document's bytes: `{"a":0}` fits 16.
const small = { type: "object", properties: { a: { type: "integer" }, b: { type: "string" } }, required: ["a"] };

check(validate(deep, { long_k2_: { long_k1_: { n: 1 } } }).length >= 2,
      "the test's validator refuses an invalid object");

async function main() {
  const { model, dir } = synthQwen3("kvp-budget-");
  const k = await startKvpd(model);
  let code = null;
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${k.port}/v1`, apiKey: KEY, maxRetries: 0 });
    const id = (await client.models.list()).data[0].id;
    const budgets = [16, 24, 32, 48, 64];
    const ask = (seed, max_tokens, extra) => client.chat.completions.create({
      model: id, seed, temperature: 1, max_tokens,
      messages: [{ role: "user", content: `Reply number ${seed}.` }], ...extra });
    const counts = { json_object: 0, small: 0, person: 0, deep: 0, required: 0, named: 0, shaped: 0, early: 0 };

    const formats = [
      ["json_object", { type: "json_object" }, null, budgets],
      ["small", { type: "json_schema", json_schema: { name: "small", schema: small } }, small, [16, 24]],
      ["person", { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } }, person, [32, 48, 64]],
      ["deep", { type: "json_schema", json_schema: { name: "deep", schema: deep } }, deep, [64]],
    ];
    for (const [what, response_format, schema, mts] of formats)
      for (const mt of mts)
        for (let s = 0; s < 40 / mts.length; s += 4) {
          const rs = await Promise.all([0, 1, 2, 3].map((j) => ask(5000 + 97 * s + j + mt, mt, { response_format })));
          for (const r of rs) {
            const c = r.choices[0], text = c.message.content;
            check(r.usage.completion_tokens <= mt, `${what} at ${mt}: within max_tokens (${r.usage.completion_tokens})`);
            check(c.finish_reason === "stop", `${what} at ${mt}: a whole document finishes "stop" (${c.finish_reason})`);
            check(c.kvpd_shaped_by === undefined || c.kvpd_shaped_by === "max_tokens",
                  `${what} at ${mt}: kvpd_shaped_by names the limit (${c.kvpd_shaped_by})`);
            // a reply that used every token of its limit was shaped by it, and says so
            check(r.usage.completion_tokens < mt || c.kvpd_shaped_by === "max_tokens",
                  `${what} at ${mt}: a reply of all ${mt} tokens says kvpd_shaped_by`);
            let v;
            try {
              v = JSON.parse(text);
            } catch (e) {
              throw new Error(`FAIL: ${what} at ${mt} (${c.finish_reason}): not JSON: ${e.message}: ${JSON.stringify(text)}`);
            }
            if (schema) {
              const errs = validate(schema, v);
              check(errs.length === 0, `${what} at ${mt} validates: ${text} ${errs.join("; ")}`);
            } else {
              check(v !== null && typeof v === "object" && !Array.isArray(v), `${what} at ${mt}: an object: ${text}`);
            }
            counts[what]++;
            counts.shaped += c.kvpd_shaped_by === "max_tokens";
            counts.early += c.kvpd_shaped_by === "max_tokens" && r.usage.completion_tokens < mt;
          }
        }

    for (const [what, tool_choice] of [["required", "required"],
                                       ["named", { type: "function", function: { name: "note" } }]])
      for (const mt of [24, 32, 48, 64])   // a call's shortest reply takes 21 tokens here
        for (let s = 0; s < 8; s += 4) {
          const rs = await Promise.all([0, 1, 2, 3].map((j) => ask(7000 + 31 * s + j + mt, mt, { tools, tool_choice })));
          for (const r of rs) {
            const c = r.choices[0], calls = c.message.tool_calls;
            check(c.finish_reason === "tool_calls", `${what} at ${mt}: finish_reason ${c.finish_reason}: ` +
                  JSON.stringify(c.message));
            check(r.usage.completion_tokens < mt || c.kvpd_shaped_by === "max_tokens",
                  `${what} at ${mt}: a call of all ${mt} tokens says kvpd_shaped_by`);
            counts.shaped += c.kvpd_shaped_by === "max_tokens";
            check(Array.isArray(calls) && calls.length === 1, `${what} at ${mt}: one call`);
            check(!c.message.content || !/<\/?tool_call>|[{}]/.test(c.message.content),
                  `${what} at ${mt}: no markup in content: ${JSON.stringify(c.message.content)}`);
            const f = calls[0].function;
            check(what !== "named" || f.name === "note", `${what}: the named function (${f.name})`);
            check(params[f.name] !== undefined, `${what}: a declared tool (${f.name})`);
            let args;
            try {
              args = JSON.parse(f.arguments);
            } catch (e) {
              throw new Error(`FAIL: ${what} at ${mt}: arguments not JSON: ${JSON.stringify(f.arguments)}`);
            }
            const errs = validate(params[f.name], args);
            check(errs.length === 0, `${what} at ${mt}: ${f.name}(${f.arguments}) validates ${errs.join("; ")}`);
            counts[what]++;
          }
        }
    check(counts.shaped > 0, `some replies were shaped by their limit (${counts.shaped})`);
    // kvpd_shaped_by also for a reply the budget closed before its last token
    check(counts.early > 0, `some replies the budget closed early say kvpd_shaped_by (${counts.early})`);

    // An unconstrained reply cut at max_tokens is not whole: "length", no kvpd_shaped_by.
    for (const stream of [false, true]) {
      const req = { model: id, seed: 9, temperature: 1, max_tokens: 4,
                    messages: [{ role: "user", content: "Tell me a long story." }] };
      let finish, shaped, tokens;
      if (stream) {
        for await (const ch of await client.chat.completions.create({ ...req, stream: true,
                                                                       stream_options: { include_usage: true } })) {
          if (ch.choices.length && ch.choices[0].finish_reason) {
            finish = ch.choices[0].finish_reason;
            shaped = ch.choices[0].kvpd_shaped_by;
          }
          if (ch.usage) tokens = ch.usage.completion_tokens;
        }
      } else {
        const r = await client.chat.completions.create(req);
        finish = r.choices[0].finish_reason;
        shaped = r.choices[0].kvpd_shaped_by;
        tokens = r.usage.completion_tokens;
      }
      check(tokens < 4 || (finish === "length" && shaped === undefined),
            `plain text cut at max_tokens (stream ${stream}): "length", not shaped (${finish}, ${shaped}, ${tokens} tokens)`);
    }
    // Streamed, a shaped document's finish chunk says "stop" and kvpd_shaped_by.
    let sfinish, sshaped, stext = "";
    for await (const ch of await client.chat.completions.create({
      model: id, seed: 11, temperature: 1, max_tokens: 16, stream: true,
      response_format: { type: "json_object" }, messages: [{ role: "user", content: "Go." }] })) {
      const c = ch.choices[0];
      if (!c) continue;
      stext += c.delta.content || "";
      if (c.finish_reason) {
        sfinish = c.finish_reason;
        sshaped = c.kvpd_shaped_by;
      }
    }
    check(sfinish === "stop" && typeof JSON.parse(stext) === "object",
          `a streamed json_object at 16 tokens is whole and finishes "stop" (${sfinish}: ${stext})`);
    check(sshaped === undefined || sshaped === "max_tokens", `its finish chunk names the limit (${sshaped})`);

    // Too small for the shortest document: refused naming max_tokens, not cut; the count
    // it names is enough, one less is not.
    const refused = async (mt) => {
      try {
        await ask(1, mt, { response_format: formats[3][1] });
      } catch (e) {
        return e;
      }
      return null;
    };
    let err = await refused(4);
    const m = err && err.status === 400 && /max_tokens \(4\) is too small.* at least (\d+)/.exec(err.message);
    check(m, `max_tokens below the shortest document: a 400 naming max_tokens (${err && err.status} ${err && err.message})`);
    const need = Number(m[1]);
    err = await refused(need - 1);
    check(err && err.status === 400, `max_tokens ${need - 1}: refused too`);
    const at = await ask(3, need, { response_format: formats[3][1] });
    const errs = validate(deep, JSON.parse(at.choices[0].message.content));
    check(errs.length === 0 && at.usage.completion_tokens <= need,
          `max_tokens ${need}: whole and valid: ${at.choices[0].message.content} (${at.choices[0].finish_reason})`);
    const after = await ask(2, 16, { response_format: { type: "json_object" } });
    check(JSON.parse(after.choices[0].message.content) !== undefined, "the daemon keeps serving");
    console.log(`budget: ${JSON.stringify(counts)} replies, every one whole and valid`);
  } finally {
    code = await stopKvpd(k, dir);
  }
  check(code === 0, `kvpd exited cleanly (${code})`);
  console.log("budget: ok");
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
