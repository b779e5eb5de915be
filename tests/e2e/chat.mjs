// Browser end-to-end test of the chat page: Debian's headless Chromium driven by
// playwright-core. Starts $KVP_BUILD/daemon/kvpd on an ephemeral port with a temporary
// state directory, sends two messages and waits for both replies to stream in with
// their stats, reloads the page (same session, its history), restarts kvpd on the same
// state directory (resumed again, and the next turn prefills only its new tokens), checks
// the page's max-tokens check, the mark of a cut reply and that nothing overflows at 1280
// and 390 pixels, and saves screenshots to $KVP_BUILD/e2e-chat*.png (e2e-chat-failure.png when it fails). Exits non-zero on any failure,
// including a missing Chromium or playwright-core (scripts/setup.sh installs both).
//
//   KVP_BUILD=build node tests/e2e/chat.mjs      (meson test --suite e2e runs it)
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = resolve(process.env.KVP_SOURCE || join(here, "..", ".."));
const build = resolve(process.env.KVP_BUILD || join(source, "build"));
const shared = resolve(process.env.KVP_SHARED || join(source, "..", "shared"));
const CHROMIUM = "/usr/bin/chromium";
const kvpdBin = join(build, "daemon", "kvpd");
const shot = (name) => join(build, name);

let failures = 0;
let passedAll = false;
const cleanups = [];

function fail(msg) {
  console.error(`e2e: FAIL: ${msg}`);
  failures++;
  throw new Error(msg);
}

function check(cond, msg) {
  if (!cond) fail(msg);
  console.log(`e2e: ok: ${msg}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function loadPlaywright() {
  try {
    return await import("playwright-core");
  } catch (e) {
    fail(`playwright-core is not installed in tests/e2e (run scripts/setup.sh, or npm ci in tests/e2e): ${e.message}`);
  }
}

// kvpd on `port` (0: any); resolves to { proc, port } once /healthz answers 200.
async function startKvpd(stateDir, port) {
  const args = [
    "--listen", `127.0.0.1:${port}`,
    "--model", join(shared, "models", "stories260K.bin"),
    "--tokenizer", join(shared, "models", "tok512.bin"),
    "--state-dir", stateDir,
    "--static-dir", join(source, "web", "static"),
    "--workers", "2", "--budget", "64", "--chunk", "16",
    "--temperature", "0", "--max-tokens", "64",
  ];
  const proc = spawn(kvpdBin, args, { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const bound = new Promise((res, rej) => {
    proc.stderr.on("data", (b) => {
      log += b.toString();
      const m = log.match(/listening on 127\.0\.0\.1:(\d+)/);
      if (m) res(Number(m[1]));
    });
    proc.on("exit", (code) => rej(new Error(`kvpd exited (${code}) before listening:\n${log}`)));
  });
  const p = await bound;
  for (let i = 0; i < 200; i++) {
    try {
      const r = await fetch(`http://127.0.0.1:${p}/healthz`);
      if (r.status === 200) return { proc, port: p, log: () => log };
    } catch {
      // not up yet
    }
    await sleep(25);
  }
  proc.kill("SIGKILL");
  fail(`kvpd did not become healthy:\n${log}`);
}

async function stopKvpd(k) {
  const exited = new Promise((res) => k.proc.on("exit", (code, sig) => res({ code, sig })));
  k.proc.kill("SIGTERM");
  const { code, sig } = await exited;
  check(code === 0, `kvpd exited 0 on SIGTERM (code ${code}, signal ${sig})`);
}

// Types a message, waits for its turn's reply and stats; returns them.
async function send(page, text, tokenFrames) {
  const before = await page.locator(".turn").count();
  const frames0 = tokenFrames.count;
  await page.fill("#max", "32");
  await page.fill("#text", text);
  await page.press("#text", "Enter");
  const turn = page.locator(".turn").nth(before);
  await turn.locator(".stats").filter({ hasText: "new tokens" }).waitFor({ timeout: 20000 });
  const reply = await turn.locator(".msg.bot").innerText();
  const stats = await turn.locator(".stats").innerText();
  check(reply.trim().length > 0, `reply to "${text}" is shown (${JSON.stringify(reply.slice(0, 40))}…)`);
  check(tokenFrames.count > frames0, `reply to "${text}" streamed in (${tokenFrames.count - frames0} token frames)`);
  check(/generated \d+/.test(stats) && /cache rows \d+/.test(stats), `stats shown beside the reply: ${stats.replace(/\n/g, "; ")}`);
  return { reply, stats };
}

async function waitSession(page, pattern, what) {
  try {
    await page.locator("#session").filter({ hasText: pattern }).waitFor({ timeout: 20000 });
  } catch {
    fail(`${what}: the session line says "${await page.locator("#session").innerText()}"`);
  }
  console.log(`e2e: ok: ${what}`);
}

async function history(page) {
  return {
    user: await page.locator(".msg.user").allInnerTexts(),
    bot: await page.locator(".msg.bot").allInnerTexts(),
  };
}

async function main() {
  if (!existsSync(CHROMIUM))
    fail(`${CHROMIUM} is missing: install Debian's chromium package (scripts/setup.sh does)`);
  if (!existsSync(kvpdBin)) fail(`${kvpdBin} is missing: build first (ninja -C ${build})`);
  const { chromium } = await loadPlaywright();

  const stateDir = mkdtempSync(join(tmpdir(), "kvpd-e2e-state-"));
  const profile = mkdtempSync(join(tmpdir(), "kvpd-e2e-profile-"));
  cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
  cleanups.push(() => rmSync(profile, { recursive: true, force: true }));

  let kvpd = await startKvpd(stateDir, 0);
  cleanups.push(() => kvpd.proc.exitCode === null && kvpd.proc.kill("SIGKILL"));
  const port = kvpd.port;

  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1000, height: 900 },
    args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync"],
  });
  cleanups.unshift(() => context.close());
  const page = context.pages()[0] || (await context.newPage());
  cleanups.unshift(async () => {
    if (failures || !passedAll) await page.screenshot({ path: shot("e2e-chat-failure.png"), fullPage: true });
  });
  page.on("pageerror", (e) => console.error(`e2e: page error: ${e.message}`));
  const tokenFrames = { count: 0 }, resumedFrames = { count: 0 };
  page.on("websocket", (ws) => ws.on("framereceived", (f) => {
    if (typeof f.payload !== "string") return;
    if (f.payload.startsWith('{"type":"token"')) tokenFrames.count++;
    if (f.payload.startsWith('{"type":"session"') && f.payload.includes('"resumed":true'))
      resumedFrames.count++;
  }));

  await page.goto(`http://127.0.0.1:${port}/`);
  await page.locator("#status").filter({ hasText: "connected" }).waitFor({ timeout: 20000 });
  await waitSession(page, "new", "a new session on the first visit");

  const m1 = "Once upon a time, there was a little dog.";
  const m2 = "The dog liked to play in the park.";
  const t1 = await send(page, m1, tokenFrames);
  const t2 = await send(page, m2, tokenFrames);
  await page.screenshot({ path: shot("e2e-chat-turns.png"), fullPage: true });
  const id = await page.evaluate(() => localStorage.getItem("kvpd.session"));
  check(/^[0-9a-f]{32}$/.test(id || ""), `the page keeps the session id (${id})`);

  // Reload: the same session comes back with its history.
  await page.reload();
  await waitSession(page, "resumed, 2 turns", "reload resumes the session with its 2 turns");
  check((await page.evaluate(() => localStorage.getItem("kvpd.session"))) === id, "same session id after reload");
  let h = await history(page);
  check(JSON.stringify(h.user) === JSON.stringify([m1, m2]), `history after reload has both messages`);
  check(h.bot.length === 2 && h.bot[0] === t1.reply && h.bot[1] === t2.reply, "history after reload has both replies");
  await page.screenshot({ path: shot("e2e-chat-reload.png"), fullPage: true });

  // Restart kvpd on the same state directory and port: the page reconnects by itself
  // and resumes the session from its snapshot.
  await stopKvpd(kvpd);
  await page.locator("#status").filter({ hasText: "disconnected" }).waitFor({ timeout: 20000 });
  const resumedBefore = resumedFrames.count;
  kvpd = await startKvpd(stateDir, port);
  await page.locator("#status").filter({ hasText: /^connected$/ }).waitFor({ timeout: 30000 });
  for (let i = 0; i < 1200 && resumedFrames.count === resumedBefore; i++) await sleep(25);
  check(resumedFrames.count > resumedBefore, "the restarted kvpd sent a resumed session frame");
  await waitSession(page, "resumed, 2 turns", "after a restart the page resumes the session");
  h = await history(page);
  check(JSON.stringify(h.user) === JSON.stringify([m1, m2]) && h.bot[1] === t2.reply,
        "history after the restart is the same");
  const t3 = await send(page, "One day, it saw a big red ball.", tokenFrames);
  const m = t3.stats.match(/new tokens (\d+) \(prefilled (\d+)\)/);
  check(m && m[1] === m[2] && Number(m[1]) < 20,
        `after the restart only the new tokens are prefilled (${m && m[0]})`);
  await page.screenshot({ path: shot("e2e-chat.png"), fullPage: true });
  await waitSession(page, "resumed, 3 turns", "the session line counts the turn just done");

  // max tokens above the daemon's cap (64, from the session frame): refused in the page,
  // nothing sent, the typed message kept.
  check((await page.getAttribute("#max", "max")) === "64", "the page takes the cap from the session frame");
  const turnsBefore = await page.locator(".turn").count();
  await page.fill("#max", "100");
  await page.fill("#text", "A message that must not be lost.");
  await page.press("#text", "Enter");
  await page.locator("#notice").filter({ hasText: "max tokens" }).waitFor({ timeout: 5000 });
  check((await page.locator(".turn").count()) === turnsBefore, "a max above the cap sends nothing");
  check((await page.inputValue("#text")) === "A message that must not be lost.", "the typed message is kept");

  // A reply cut by the token limit is marked as cut.
  await page.fill("#max", "3");
  await page.press("#text", "Enter");
  const cutTurn = page.locator(".turn").nth(turnsBefore);
  await cutTurn.locator(".stats").filter({ hasText: "new tokens" }).waitFor({ timeout: 20000 });
  check((await page.locator("#notice").innerText()) === "", "the notice clears once a message is sent");
  check(await cutTurn.locator(".msg.bot.cut").count() === 1, "a reply cut at max tokens is marked");
  check(/cut at the token limit/.test(await cutTurn.locator(".stats").innerText()), "its stats say it was cut");
  await waitSession(page, "resumed, 4 turns", "the session line is current");

  // Nothing overflows at a desktop width and at a 390-pixel phone width.
  for (const width of [1280, 390]) {
    await page.setViewportSize({ width, height: 844 });
    await sleep(100);
    const over = await page.evaluate(() => {
      const bad = [];
      const vw = document.documentElement.clientWidth;
      if (document.documentElement.scrollWidth > vw + 1) bad.push(`page ${document.documentElement.scrollWidth} > ${vw}`);
      for (const el of document.querySelectorAll("header, header *, form, form *, .turn, .msg, .stats")) {
        const r = el.getBoundingClientRect();
        if (r.width === 0) continue;
        if (r.right > vw + 1) bad.push(`${el.tagName}.${el.className} ends at ${Math.round(r.right)} > ${vw}`);
        if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX === "visible" && el.clientWidth > 0)
          bad.push(`${el.tagName}.${el.className} content ${el.scrollWidth} > box ${el.clientWidth}`);
      }
      return bad;
    });
    await page.screenshot({ path: shot(`e2e-chat-${width}.png`), fullPage: true });
    check(over.length === 0, `nothing overflows at ${width} px${over.length ? ": " + over.slice(0, 4).join("; ") : ""}`);
  }
  console.log(`e2e: screenshots ${shot("e2e-chat-turns.png")} (two replies with stats), ` +
              `${shot("e2e-chat-reload.png")} (history after reload), ${shot("e2e-chat.png")} ` +
              "(after the restart)");
  await stopKvpd(kvpd);
}

const watchdog = setTimeout(() => {
  console.error("e2e: FAIL: timed out after 100 s");
  process.exit(1);
}, 100000);

let passed = 0;
try {
  await main();
  passed = 1;
  passedAll = true;
} catch (e) {
  if (!failures) console.error(`e2e: FAIL: ${e.stack || e}`);
}
for (const c of cleanups) {
  try {
    await c();
  } catch {
    // best effort
  }
}
clearTimeout(watchdog);
console.log(`e2e: ${passed} passed, ${1 - passed} failed`);
process.exit(passed ? 0 : 1);
