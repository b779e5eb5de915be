// kvpd chat page: one websocket to /chat, the session id kept in localStorage and
// resumed on reload, replies streamed token by token, per-turn stats beside them. With an
// API key (the field, kept in localStorage) the first frame is {"type":"auth"}: a
// browser's WebSocket cannot send an Authorization header.
"use strict";
const $ = (id) => document.getElementById(id);
const log = $("log"), text = $("text"), form = $("form");
let ws = null, sessionId = localStorage.getItem("kvpd.session"), current = null, retry = 500;
// The daemon's cap of max_tokens (from the session frame) and the session line's parts.
let cap = null, origin = "", turns = 0;

function setStatus(s) { $("status").textContent = s; }
function busy(on) { $("send").disabled = on; $("cancel").disabled = !on; }
function notice(msg) { $("notice").textContent = msg || ""; }
function sessionLine() {
  $("session").textContent = sessionId
    ? `session ${sessionId.slice(0, 8)}… ${origin}, ${turns} turn${turns === 1 ? "" : "s"}`
    : "starting a new session…";
}

function addTurn(userText) {
  const turn = document.createElement("div");
  turn.className = "turn";
  const u = document.createElement("div");
  u.className = "msg user";
  u.textContent = userText;
  const b = document.createElement("div");
  b.className = "msg bot streaming";
  const st = document.createElement("div");
  st.className = "stats";
  turn.append(u, st, b);
  log.append(turn);
  log.scrollTop = log.scrollHeight;
  return { turn, bot: b, stats: st, text: userText, got: false };
}

// The current turn ends without a reply (refused, or the connection went): its message
// goes back into the box unless something new was typed there, so it is never lost.
function abandon() {
  if (!current) return;
  current.bot.classList.remove("streaming");
  if (!current.got && !text.value) text.value = current.text;
  current = null;
  busy(false);
}

function showStats(el, s) {
  const kib = (s.cache_bytes / 1024).toFixed(1);
  el.textContent =
    `new tokens ${s.prompt_tokens} (prefilled ${s.prefilled_tokens})\n` +
    `generated ${s.generated_tokens}, ${s.tokens_per_s.toFixed(1)} tok/s\n` +
    `first token ${s.ttft_ms.toFixed(1)} ms\n` +
    `cache rows ${s.cache_rows} (peak ${s.cache_rows_max}), ${kib} KiB\n` +
    `evicted ${s.evicted_rows} this turn, ${s.evicted_rows_total} total` +
    (s.stop === "cancel" ? "\n(stopped)" : s.stop === "length" ? "\n(cut at the token limit)" : "");
}

// A resumed conversation: earlier turns from the transcript (no stats for those).
// The model's reply usually starts with the space (or newline) that separates it from
// the prompt; the transcript keeps it, the page does not show it.
function shown(text) { return text.replace(/^\s+/, ""); }

function renderHistory(history) {
  log.textContent = "";
  let turn = null;
  for (const h of history) {
    if (h.role === "user") {
      turn = addTurn(h.text);
    } else if (turn) {
      turn.bot.textContent = shown(h.text);
      turn.bot.classList.remove("streaming");
      turn = null;
    }
  }
  if (turn) turn.bot.classList.remove("streaming");
}

function showError(msg) {
  const e = document.createElement("div");
  e.className = "error";
  e.textContent = msg;
  (current ? current.turn : log).append(e);
}

const keyField = $("key");
keyField.value = localStorage.getItem("kvpd.key") || "";

function hello() {
  ws.send(JSON.stringify(sessionId ? { type: "hello", session: sessionId } : { type: "hello" }));
}

function connect() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(`${proto}//${location.host}/chat`);
  ws.onopen = () => {
    retry = 500;
    setStatus("connected");
    const key = keyField.value;
    if (key) ws.send(JSON.stringify({ type: "auth", token: key }));
    else hello();
  };
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.type === "auth") {
      if (m.ok) hello();
    } else if (m.type === "session") {
      sessionId = m.id;
      localStorage.setItem("kvpd.session", m.id);
      origin = m.resumed ? "resumed" : "new";
      turns = m.turns;
      sessionLine();
      if (m.max_tokens) {
        cap = m.max_tokens;
        $("max").max = String(cap);
        if (Number($("max").value) > cap) $("max").value = String(cap);
      }
      if (m.resumed && !current) renderHistory(m.history || []);
    } else if (m.type === "token" && current) {
      current.got = true;
      current.bot.textContent = shown(current.bot.textContent + m.text);
      log.scrollTop = log.scrollHeight;
    } else if (m.type === "done" && current) {
      current.bot.textContent = shown(m.reply);
      current.bot.classList.remove("streaming");
      if (m.stats.stop === "length") current.bot.classList.add("cut");
      showStats(current.stats, m.stats);
      current = null;
      turns++;
      sessionLine();
      busy(false);
    } else if (m.type === "error") {
      if (m.code === "unknown_session") {
        // Expired or the daemon restarted: start over with a new session.
        sessionId = null;
        localStorage.removeItem("kvpd.session");
        sessionLine();
        ws.send(JSON.stringify({ type: "hello" }));
      }
      if (m.code === "overloaded" && !current) {
        // The hello was refused for now (the model is still loading after a restart, or
        // no room): ask again, or the page would stay without a session.
        const sent = ws;
        setTimeout(() => {
          if (sent === ws && ws.readyState === WebSocket.OPEN)
            ws.send(JSON.stringify(sessionId ? { type: "hello", session: sessionId } : { type: "hello" }));
        }, m.retry_after_ms || 1000);
      }
      showError(`${m.code}: ${m.message}`);
      abandon();
    }
  };
  ws.onclose = (ev) => {
    // 1008: the daemon wants an API key (none given, or a wrong one).
    setStatus(ev.code === 1008 ? `API key needed (${ev.reason}), retrying…`
                               : "disconnected, retrying…");
    abandon();
    setTimeout(connect, retry);
    retry = Math.min(retry * 2, 8000);
  };
}

form.addEventListener("submit", (e) => {
  e.preventDefault();
  const t = text.value.trim();
  if (!t || current || !ws || ws.readyState !== WebSocket.OPEN) return;
  // max tokens: empty for the daemon's default, else a whole number from 1 to the cap;
  // anything else is refused here and the message stays in the box
  const max = $("max"), raw = max.value.trim(), n = Number(raw);
  if (raw !== "" && (!Number.isInteger(n) || n < 1 || (cap && n > cap))) {
    notice(`max tokens must be a whole number from 1 to ${cap || "the daemon's limit"}`);
    max.setAttribute("aria-invalid", "true");
    max.focus();
    return;
  }
  notice("");
  max.removeAttribute("aria-invalid");
  current = addTurn(t);
  busy(true);
  ws.send(JSON.stringify({ type: "message", text: t, max_tokens: raw === "" ? undefined : n }));
  text.value = "";
});
text.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
});
$("cancel").addEventListener("click", () => ws && ws.send(JSON.stringify({ type: "cancel" })));
$("new").addEventListener("click", () => {
  sessionId = null;
  localStorage.removeItem("kvpd.session");
  log.textContent = "";
  sessionLine();
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "hello" }));
});
// A changed key is kept and used from a new connection (the old one keeps its key).
keyField.addEventListener("change", () => {
  if (keyField.value) localStorage.setItem("kvpd.key", keyField.value);
  else localStorage.removeItem("kvpd.key");
  retry = 500;
  if (ws) ws.close();
});
busy(false);
connect();
