// envgit mcp's REPL: runs inside the sandbox (bwrap, no network), one process per MCP session.
// Its only channel is stdio, one JSON object a line:
//   in:  {"op":"exec","id","code"}     run code; its top-level declarations persist
//        {"op":"reply","call","ok","value"|"error"}   the answer to a tool call
//   out: {"op":"call","exec","call","server","tool","args"}   an upstream tool call
//        {"op":"done","exec","output","output_bytes","value","error","read_bytes","stdin_bytes"}
// The config (argv[1], JSON): {"servers": {server: {binding: tool name}}, "cap": bytes kept}.
// Everything is inside one function: the code runs in this global scope and must not see
// (or clobber) the REPL's own names.
(() => {
  'use strict';
  const fs = require('node:fs');
  const util = require('node:util');
  const vm = require('node:vm');
  const readline = require('node:readline');
  const { Console } = require('node:console');
  const { Writable } = require('node:stream');
  const { createRequire } = require('node:module');
  const { processTopLevelAwait } = require('internal/repl/await');   // node --expose-internals

  const config = JSON.parse(process.argv[1]);
  const writeChannel = process.stdout.write.bind(process.stdout);
  const send = (obj) => writeChannel(JSON.stringify(obj) + '\n');

  // --- what the code prints: kept up to the cap, counted whole ---------------------------
  let kept = [], keptBytes = 0, totalBytes = 0;
  function capture(text) {
    const b = Buffer.byteLength(text);
    totalBytes += b;
    if (keptBytes < config.cap) {
      kept.push(text);
      keptBytes += b;
    }
  }
  const sink = new Writable({ write(chunk, _enc, cb) { capture(chunk.toString()); cb(); } });
  globalThis.console = new Console({ stdout: sink, stderr: sink });
  // The code must not write on the channel itself: its stdout and stderr are captured too.
  process.stdout.write = (chunk, enc, cb) => { capture(String(chunk)); if (typeof cb === 'function') cb(); return true; };
  process.stderr.write = process.stdout.write;

  // --- upstream tools as async functions ---------------------------------------------------
  let current = null;          // the running execution's id
  let nextCall = 1;
  const waiting = new Map();   // call id -> {resolve, reject}
  function callTool(server, tool, args) {
    if (current === null) return Promise.reject(new Error('a tool call outside execute (a timer left running?)'));
    const call = nextCall++;
    return new Promise((resolve, reject) => {
      waiting.set(call, { resolve, reject });
      send({ op: 'call', exec: current, call, server, tool, args: args === undefined ? {} : args });
    });
  }
  for (const [server, tools] of Object.entries(config.servers)) {
    const ns = {};
    for (const [binding, tool] of Object.entries(tools)) ns[binding] = (args) => callTool(server, tool, args);
    globalThis[server] = Object.freeze(ns);
  }

  // --- helpers -----------------------------------------------------------------------------
  globalThis.sample = function sample(value, n = 5) {
    // n items spread evenly over an array (lines of a string, entries of an object)
    const pick = (arr) => arr.length <= n ? arr.slice() :
      Array.from({ length: n }, (_, i) => arr[Math.floor(i * (arr.length - 1) / Math.max(1, n - 1))]);
    if (typeof value === 'string') return pick(value.split('\n')).join('\n');
    if (Array.isArray(value)) return pick(value);
    if (value && typeof value === 'object') return Object.fromEntries(pick(Object.entries(value)));
    return value;
  };
  globalThis.schema = function schema(value, depth = 4) {
    // the shape of a value without its data: types, keys, array lengths
    if (value === null) return 'null';
    if (Array.isArray(value)) {
      if (depth <= 0) return `array[${value.length}]`;
      const shapes = [...new Set(value.slice(0, 20).map((v) => JSON.stringify(schema(v, depth - 1))))];
      return { array: value.length, of: shapes.map((s) => JSON.parse(s)) };
    }
    if (typeof value === 'object') {
      if (depth <= 0) return 'object';
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, schema(v, depth - 1)]));
    }
    if (typeof value === 'string') return `string(${value.length})`;
    return typeof value;
  };
  globalThis.assert = function assert(cond, message) {
    if (!cond) throw new Error(message || 'assertion failed');
  };
  globalThis.require = createRequire(process.cwd() + '/');

  // --- running code --------------------------------------------------------------------------
  function compile(code) {
    // As Node's own REPL does: top-level await and declarations that outlive the call. The
    // leading `await` makes every input take that path; hoisted let/const become var so that
    // a later call may declare the same name again.
    const wrapped = processTopLevelAwait('await undefined;\n' + code);
    if (wrapped !== null) {
      const at = wrapped.indexOf('(async () => {');
      return wrapped.slice(0, at).replace(/\blet\b/g, 'var') + wrapped.slice(at);
    }
    // Not parseable as a REPL input (e.g. a top-level `return`): run it as a function body.
    return '(async () => {\n' + code + '\n})().then((value) => ({ value }))';
  }

  function render(value) {
    if (value === undefined) return null;
    if (typeof value === 'string') return value;
    try {
      const json = JSON.stringify(value);
      if (json !== undefined) return json;
    } catch (_) { /* cyclic or BigInt: inspect below */ }
    return util.inspect(value, { depth: 6 });
  }

  function readChars(own) {
    // bytes this process has read so far; `own`: with this read of /proc/self/io counted
    try {
      const text = fs.readFileSync('/proc/self/io', 'utf8');
      return Number(/rchar:\s*(\d+)/.exec(text)[1]) + (own ? text.length : 0);
    } catch (_) {
      return null;
    }
  }

  let stdinBytes = 0;
  async function execute(msg) {
    current = msg.id;
    kept = []; keptBytes = 0; totalBytes = 0;
    const stdinBefore = stdinBytes, readBefore = readChars(true);
    let value = null, error = null;
    try {
      const out = await vm.runInThisContext(compile(msg.code), { filename: 'execute' });
      value = render(out === undefined ? undefined : out.value);
    } catch (e) {
      error = e instanceof Error ? (e.stack || String(e)).split('\n    at ')[0] : 'thrown: ' + render(e);
    }
    current = null;
    const readAfter = readChars(false);
    // reads of the channel are the tool results, already counted by envgit
    const ownReads = readBefore === null ? null :
      Math.max(0, readAfter - readBefore - (stdinBytes - stdinBefore));
    send({ op: 'done', exec: msg.id, output: kept.join(''), output_bytes: totalBytes, value, error,
           read_bytes: ownReads });
  }

  process.on('unhandledRejection', (e) => capture(`unhandled rejection: ${e && e.message || e}\n`));
  process.on('uncaughtException', (e) => capture(`uncaught exception: ${e && e.message || e}\n`));
  process.stdin.on('data', (chunk) => { stdinBytes += chunk.length; });
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  let queue = Promise.resolve();
  lines.on('line', (line) => {
    const msg = JSON.parse(line);
    if (msg.op === 'reply') {
      const w = waiting.get(msg.call);
      waiting.delete(msg.call);
      if (w) msg.ok ? w.resolve(msg.value) : w.reject(new Error(msg.error));
    } else if (msg.op === 'exec') {
      queue = queue.then(() => execute(msg));
    }
  });
  lines.on('close', () => process.exit(0));
  send({ op: 'ready' });
})();
