// Tool calling over the /chat websocket (docs/protocol.md, "Tools") on a qwen2-shaped
// synthetic with random weights carrying Qwen3's real tokenizer and template (Hermes
// <tool_call> format): tools given in the hello, a message with tool_choice "required"
// gives tool_call frames (a declared tool, arguments valid against its parameters, by
// the forced-call grammar) and no call text among the token frames; done lists the same
// calls and its reply is the tokens' text; a tool_result naming the call continues the
// session prefilling only the results; the resumed session's history shows the tool
// message; a named function is the one called; malformed tools and results are
// bad_request and the connection keeps serving.
//
//   KVP_BUILD=build node tests/openai/ws_tools.mjs   (meson test --suite openai runs it)
import { checker, KEY, startKvpd, stopKvpd, synthQwen3, validate } from "./lib.mjs";

const check = checker("ws_tools");

let WebSocket;
try {
  ({ default: WebSocket } = await import("ws"));
} catch (e) {
  console.error(`ws_tools: ws is not installed in tests/openai (run scripts/setup.sh): ${e.message}`);
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
const tools = Object.entries(params).map(([name, parameters]) => ({
  type: "function", function: { name, description: `The ${name} tool.`, parameters },
}));

// A connection whose frames are read in order: next() gives the next one.
async function connect(port) {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/chat`, { headers: { Authorization: `Bearer ${KEY}` } });
  const queue = [], waiters = [];
  ws.on("message", (data) => {
    const f = JSON.parse(data.toString());
    if (waiters.length) waiters.shift()(f);
    else queue.push(f);
  });
  await new Promise((res, rej) => { ws.on("open", res); ws.on("error", rej); });
  const next = () => (queue.length ? Promise.resolve(queue.shift())
    : new Promise((res, rej) => {
      const t = setTimeout(() => rej(new Error("FAIL: no frame within 60 s")), 60000);
      waiters.push((f) => { clearTimeout(t); res(f); });
    }));
  const send = (o) => ws.send(JSON.stringify(o));
  // A turn's frames up to its done (or an error).
  const turn = async (o) => {
    send(o);
    const tokens = [], calls = [];
    for (;;) {
      const f = await next();
      if (f.type === "token") tokens.push(f.text);
      else if (f.type === "tool_call") calls.push(f);
      else if (f.type === "done" || f.type === "error") return { end: f, tokens, calls };
      else throw new Error(`FAIL: unexpected frame ${JSON.stringify(f)}`);
    }
  };
  return { ws, next, send, turn };
}

function validCall(c, what, name) {
  check(typeof c.id === "string" && c.id.startsWith("call_"), `${what}: the call has an id (${c.id})`);
  check(params[c.name] !== undefined && (!name || c.name === name), `${what}: names ${name || "a declared tool"} (${c.name})`);
  const errs = validate(params[c.name], JSON.parse(c.arguments));
  check(errs.length === 0, `${what}: ${c.name}(${c.arguments}) validates` + (errs.length ? `: ${errs.join("; ")}` : ""));
}

async function main() {
  const { model, dir } = synthQwen3("kvp-wstools-");
  const k = await startKvpd(model);
  let code = null;
  try {
    const a = await connect(k.port);
    a.send({ type: "hello", tools });
    const session = await a.next();
    check(session.type === "session" && session.id, `hello with tools opens a session (${session.id})`);

    const r1 = await a.turn({ type: "message", text: "What is the weather in Oslo?", tool_choice: "required",
                              temperature: 1, seed: 7, max_tokens: 512 });
    check(r1.end.type === "done", `the forced turn ends with done (${JSON.stringify(r1.end).slice(0, 200)})`);
    check(r1.calls.length === 1, `one tool_call frame (${r1.calls.length})`);
    validCall(r1.calls[0], "required");
    check(!r1.tokens.join("").includes("<tool_call>"), `no call text among the tokens (${JSON.stringify(r1.tokens.join(""))})`);
    check(JSON.stringify(r1.end.tool_calls) === JSON.stringify(r1.calls.map(({ id, name, arguments: x }) => ({ id, name, arguments: x }))),
          "done lists the same calls");
    check(r1.end.reply === r1.tokens.join(""), "done's reply is the tokens' text");

    const r2 = await a.turn({ type: "tool_result", results: [{ id: r1.calls[0].id, content: "sunny, 21 C" }],
                              tool_choice: "none", max_tokens: 8 });
    check(r2.end.type === "done" && r2.end.tool_calls === undefined, "the tool result's turn ends with done, no calls (tool_choice none)");
    const st = r2.end.stats;
    check(st.prefilled_tokens === st.prompt_tokens && st.prompt_tokens < r1.end.stats.transcript_tokens,
          `the tool result prefills only itself (${st.prefilled_tokens} of ${st.transcript_tokens} tokens)`);
    a.ws.close();

    // the resumed session's history holds the tool message
    const b = await connect(k.port);
    b.send({ type: "hello", session: session.id });
    const resumed = await b.next();
    const roles = resumed.history.map((m) => m.role);
    check(JSON.stringify(roles) === JSON.stringify(["user", "assistant", "tool", "assistant"]),
          `the history's roles: ${roles.join(", ")}`);
    check(resumed.history[2].text.includes("sunny, 21 C"), "the tool message holds the result");
    // the connection has no tools of its own: a message's tools and a named function
    const r3 = await b.turn({ type: "message", text: "Add them.", tools,
                              tool_choice: { type: "function", function: { name: "add" } }, max_tokens: 512 });
    check(r3.end.type === "done" && r3.calls.length === 1, "a named function: one call");
    validCall(r3.calls[0], "named add", "add");
    // a result from another connection's call must name the tool
    const bad1 = await b.turn({ type: "tool_result", results: [{ id: r1.calls[0].id, content: "x" }] });
    check(bad1.end.type === "error" && bad1.end.code === "bad_request" && /give its name/.test(bad1.end.message),
          `a result for a call not of this connection's last reply needs its name: ${bad1.end.message}`);
    const ok = await b.turn({ type: "tool_result", results: [{ id: r3.calls[0].id, content: "3" }], max_tokens: 4, tools,
                              tool_choice: "none" });
    check(ok.end.type === "done", "the result of this connection's call is taken by id");

    // malformed input: bad_request, and the connection keeps serving
    const c = await connect(k.port);
    c.send({ type: "hello" });
    await c.next();
    const refusals = [
      [{ type: "message", text: "x", tools: { name: "f" } }, /tools must be an array/],
      [{ type: "message", text: "x", tool_choice: "required" }, /tool_choice needs tools/],
      [{ type: "message", text: "x", tools, tool_choice: { type: "function", function: { name: "nope" } } }, /does not declare|nope/],
      [{ type: "message", text: "x", tools: [{ type: "function", function: { name: "bad name!" } }] }, /name/],
      [{ type: "tool_result", results: [] }, /results must be an array/],
      [{ type: "tool_result", results: [{ id: "", content: "x" }] }, /id must be/],
      [{ type: "tool_result", results: [{ id: "call_1", content: 5 }] }, /content must be a string/],
      [{ type: "tool_result", results: [{ id: "call_1", content: "x", extra: 1 }] }, /has no field "extra"/],
      [{ type: "tool_result", results: [{ id: "call_1", content: "x" }], text: "y" }, /has no field "text"/],
      [{ type: "hello", tools: "f" }, /tools must be an array/],
    ];
    for (const [msg, pattern] of refusals) {
      c.send(msg);
      const f = await c.next();
      check(f.type === "error" && f.code === "bad_request" && pattern.test(f.message),
            `${JSON.stringify(msg).slice(0, 90)}: bad_request (${f.message})`);
    }
    const after = await c.turn({ type: "message", text: "Still there?", max_tokens: 4 });
    check(after.end.type === "done" && after.end.tool_calls === undefined, "the connection keeps serving, without tools");
    b.ws.close();
    c.ws.close();
  } finally {
    code = await stopKvpd(k, dir);
  }
  check(code === 0, `kvpd exited 0 on SIGTERM (${code})`);
}

main().then(() => console.log("ws_tools: all passed"), (e) => {
  console.error(`ws_tools: ${e.stack || e}`);
  process.exit(1);
});
