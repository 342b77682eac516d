// amqlite.js: the browser client of amqlite (docs/browser.md). One ES module, no
// build step, no dependency; the broker serves it at /js/amqlite.js.
//
//   import { connect } from "http://broker:15672/js/amqlite.js";
//   const conn = await connect({ servers: ["http://a:15672", "http://b:15673"],
//                                login: "guest", password: "guest" });
//   await conn.subscribe({ exchange: "amq.topic", key: "orders.#" }, (msg) => show(msg.text));
//   await conn.publish("amq.topic", "orders.1", "hello", { confirm: true });
//
// Channels are tried in order for each server ("ws", then "poll": HTTP long
// polling, for networks that block WebSockets), servers in order (an HA pair lists
// its primary, then its backup). When the channel in use breaks, the connection
// opens again on the first server that lets it in, subscribes again and sends again
// every confirmed publish not yet confirmed. A { queue } subscription to a durable
// queue loses nothing confirmed (messages not acknowledged come again, flagged
// redelivered); an { exchange, key } subscription fires a "missed" event, as it does
// when the broker dropped messages a slow page did not take in time.

const DEFAULTS = {
  servers: [""], // "" = the origin the page came from
  channels: ["ws", "poll"],
  login: "guest",
  password: "guest",
  vhost: "/",
  client: "amqlite.js",
  wsTimeout: 3000, // ms for a WebSocket to open before the next channel is tried
  requestTimeout: 15000, // ms for a poll session to open
  failoverTimeout: 60000, // ms of trying every server again before giving up
  maxLength: 10000, // messages an { exchange, key } subscription's queue holds at most
};
const NOT_ACTIVE = 360; // a passive HA node: try the next server
const POLL_WAIT = 20; // seconds a poll is held

/** An error from the broker, with its reply code (403, 404, 406, 360, ...). */
export class AmqliteError extends Error {
  constructor(message, code = 0) {
    super(message);
    this.name = "AmqliteError";
    this.code = code;
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function toBase64(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function asBytes(body) {
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  return null;
}

function base(server) {
  return (server || "").replace(/\/+$/, "");
}

// --- channels: one broker session each -------------------------------------------------

/** A WebSocket to /ws: JSON text frames both ways. */
class WsChannel {
  constructor(server, options, onframe, onlost) {
    this.kind = "ws";
    this.server = server;
    this.options = options;
    this.onframe = onframe;
    this.onlost = onlost;
    this.socket = null;
    this.open = false;
    this.beat = null; // the heartbeat timer, once welcomed
    this.heard = 0; // when the broker last sent anything (ms)
  }

  /** Heartbeats (the welcome's `heartbeat`, seconds; 0: off): send one each
   * period, and treat three periods without a frame from the broker as a lost
   * channel (a stopped or cut-off server never closes the socket itself). */
  startHeartbeat(seconds) {
    if (!seconds) return;
    const period = seconds * 1000;
    this.beat = setInterval(() => {
      if (!this.open) return;
      if (Date.now() - this.heard > 3 * period) {
        this.stopHeartbeat();
        this.open = false;
        try { this.socket.close(4000); } catch (_) { /* already closing */ }
        this.onlost(`the broker sent nothing for ${+(3 * seconds).toFixed(3)} s`);
        return;
      }
      this.socket.send('{"m":"heartbeat"}');
    }, period);
  }

  stopHeartbeat() {
    if (this.beat !== null) clearInterval(this.beat);
    this.beat = null;
  }

  connect(hello) {
    let url = base(this.server) || location.origin;
    url = url.replace(/^http/, "ws") + "/ws";
    return new Promise((resolve, reject) => {
      let settled = false;
      const fail = (error) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        try { socket.close(); } catch (_) { /* never opened */ }
        reject(error);
      };
      let socket;
      try {
        socket = new WebSocket(url);
      } catch (error) {
        reject(new Error(`WebSocket: ${error.message}`));
        return;
      }
      this.socket = socket;
      const timer = setTimeout(
        () => fail(new Error(`WebSocket did not open within ${this.options.wsTimeout} ms`)),
        this.options.wsTimeout,
      );
      socket.onopen = () => socket.send(JSON.stringify(hello));
      socket.onerror = () => fail(new Error("WebSocket could not open"));
      socket.onclose = (event) => {
        this.stopHeartbeat();
        if (!settled) {
          fail(new Error(`WebSocket closed (${event.code})`));
        } else if (this.open) {
          this.open = false;
          this.onlost(`WebSocket closed (${event.code}${event.reason ? ": " + event.reason : ""})`);
        }
      };
      socket.onmessage = (event) => {
        this.heard = Date.now();
        let value;
        try {
          value = JSON.parse(event.data);
        } catch (_) {
          return;
        }
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          if (value.m === "welcome") {
            this.open = true;
            this.startHeartbeat(value.heartbeat);
            resolve(value);
          } else {
            socket.close();
            reject(new AmqliteError(value.text || "refused", value.code || 0));
          }
          return;
        }
        for (const frame of Array.isArray(value) ? value : [value]) {
          if (frame.m !== "heartbeat") this.onframe(frame);
        }
      };
    });
  }

  send(frames) {
    if (!this.open) return;
    this.socket.send(JSON.stringify(frames.length === 1 ? frames[0] : frames));
  }

  close() {
    this.open = false;
    this.stopHeartbeat();
    if (this.socket) this.socket.close(1000);
  }
}

/** HTTP long polling: POST /poll/open, POST /poll/send, GET /poll/recv. */
class PollChannel {
  constructor(server, options, onframe, onlost) {
    this.kind = "poll";
    this.server = base(server);
    this.options = options;
    this.onframe = onframe;
    this.onlost = onlost;
    this.token = null;
    this.open = false;
    this.queue = [];
    this.sending = false;
    this.abort = new AbortController();
  }

  async connect(hello) {
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), this.options.requestTimeout);
    let response;
    try {
      const { login, password, vhost, client } = hello;
      response = await fetch(`${this.server}/poll/open`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ login, password, vhost, client }),
        credentials: "omit",
        signal: timeout.signal,
      });
    } catch (error) {
      throw new Error(`polling: cannot reach ${this.server || location.origin} (${error.message})`);
    } finally {
      clearTimeout(timer);
    }
    let answer = {};
    try {
      answer = await response.json();
    } catch (_) { /* not JSON */ }
    if (!response.ok) {
      throw new AmqliteError(answer.reason || `HTTP ${response.status}`, answer.code || response.status);
    }
    this.token = answer.session;
    this.open = true;
    this.receive();
    return answer;
  }

  headers(json) {
    const headers = { "x-amqlite-session": this.token };
    if (json) headers["content-type"] = "application/json";
    return headers;
  }

  lost(reason) {
    if (!this.open) return;
    this.open = false;
    this.abort.abort();
    this.onlost(reason);
  }

  async receive() {
    let ack = 0;
    while (this.open) {
      let answer;
      try {
        const response = await fetch(`${this.server}/poll/recv?ack=${ack}&wait=${POLL_WAIT}`, {
          headers: this.headers(false),
          credentials: "omit",
          signal: this.abort.signal,
        });
        if (response.status !== 200) {
          this.lost(`poll answered HTTP ${response.status}`);
          return;
        }
        answer = await response.json();
      } catch (error) {
        this.lost(`poll failed (${error.message})`);
        return;
      }
      ack = answer.last;
      for (const frame of answer.frames) {
        if (!this.open) return;
        this.onframe(frame);
      }
    }
  }

  send(frames) {
    if (!this.open) return;
    this.queue.push(...frames);
    if (!this.sending) this.flush();
  }

  async flush() {
    this.sending = true;
    while (this.open && this.queue.length) {
      const batch = this.queue.splice(0, this.queue.length);
      try {
        const response = await fetch(`${this.server}/poll/send`, {
          method: "POST",
          headers: this.headers(true),
          body: JSON.stringify(batch),
          credentials: "omit",
          signal: this.abort.signal,
        });
        if (!response.ok) {
          this.lost(`send answered HTTP ${response.status}`);
          break;
        }
      } catch (error) {
        this.lost(`send failed (${error.message})`);
        break;
      }
    }
    this.sending = false;
  }

  close() {
    if (!this.open) return;
    this.open = false;
    this.abort.abort();
    fetch(`${this.server}/poll/close`, {
      method: "POST", headers: this.headers(false), credentials: "omit", keepalive: true,
    }).catch(() => {});
  }
}

const CHANNELS = { ws: WsChannel, poll: PollChannel };

// --- messages and subscriptions -------------------------------------------------------

class Message {
  constructor(conn, channel, frame, manual) {
    this.body = frame.body64 !== undefined ? fromBase64(frame.body64) : encoder.encode(frame.body ?? "");
    this._text = frame.body;
    this.exchange = frame.exchange;
    this.routingKey = frame.key;
    this.headers = frame.headers || {};
    this.properties = frame.props || {};
    this.redelivered = !!frame.redelivered;
    this.deliveryTag = frame.dtag;
    this._conn = conn;
    this._channel = channel;
    this._manual = manual;
    this._settled = !manual;
  }

  get text() {
    if (this._text === undefined) this._text = decoder.decode(this.body);
    return this._text;
  }

  /** Acknowledge (manual subscriptions; nothing to do for "auto"). */
  ack() {
    this._settle({ m: "ack", dtag: this.deliveryTag });
  }

  /** Give it back: requeued unless { requeue: false }. */
  nack({ requeue = true } = {}) {
    this._settle({ m: "nack", dtag: this.deliveryTag, requeue });
  }

  _settle(frame) {
    if (this._settled) return;
    this._settled = true;
    // a delivery of a channel that broke comes again on the next one
    if (this._conn._channel === this._channel) this._conn._send({ ...frame, id: this._conn._nextId++ });
  }
}

class Subscription extends EventTarget {
  constructor(conn, target, callback, options) {
    super();
    this.conn = conn;
    this.target = { ...target };
    this.callback = callback;
    this.ack = options.ack || "auto";
    if (this.ack !== "auto" && this.ack !== "manual") throw new TypeError('ack must be "auto" or "manual"');
    this.prefetch = options.prefetch || 100;
    this.tag = null;
    this.queue = target.queue ?? null;
    this.missed = 0;
    this.cancelled = false;
  }

  async start() {
    const conn = this.conn;
    let queue = this.target.queue;
    if (queue === undefined) {
      if (typeof this.target.exchange !== "string") throw new TypeError("subscribe to { queue } or { exchange, key }");
      const declared = await conn._request({
        m: "queue.declare", queue: "", exclusive: true, auto_delete: true,
        arguments: { "x-max-length": conn.options.maxLength },
      });
      queue = declared.queue;
      await conn._request({ m: "queue.bind", queue, exchange: this.target.exchange, key: this.target.key ?? "" });
    }
    this.queue = queue;
    const manual = this.ack === "manual";
    this.channel = conn._channel;
    // the consumer is known as its ok arrives: its first deliveries may follow in
    // the same batch of frames, before a promise's continuation would run
    await conn._request(
      { m: "consume", queue, no_ack: !manual, prefetch: manual ? this.prefetch : 0 },
      false,
      (info) => {
        this.tag = info.tag;
        conn._consumers.set(info.tag, this);
      },
    );
  }

  deliver(frame) {
    const msg = new Message(this.conn, this.channel, frame, this.ack === "manual");
    try {
      this.callback(msg);
    } catch (error) {
      setTimeout(() => { throw error; });
    }
  }

  missedSome(reason, count) {
    this.missed += count || 0;
    const detail = { subscription: this, reason, count: count || null };
    this.dispatchEvent(new CustomEvent("missed", { detail }));
    this.conn.dispatchEvent(new CustomEvent("missed", { detail }));
  }

  /** Stop it; resolves once the broker has. */
  async cancel() {
    if (this.cancelled) return;
    this.cancelled = true;
    this.conn._subscriptions.delete(this);
    const tag = this.tag;
    if (tag === null) return;
    try {
      await this.conn._request({ m: "cancel", tag });
    } finally {
      this.conn._consumers.delete(tag);
    }
  }
}

// --- the connection -------------------------------------------------------------------

class Connection extends EventTarget {
  constructor(options) {
    super();
    this.options = { ...DEFAULTS, ...options };
    if (!Array.isArray(this.options.servers) || !this.options.servers.length) {
      throw new TypeError("servers must be a non-empty array of URLs");
    }
    for (const kind of this.options.channels) {
      if (!CHANNELS[kind]) throw new TypeError(`unknown channel ${JSON.stringify(kind)} ("ws" or "poll")`);
    }
    this.channel = null; // "ws" or "poll"
    this.server = null; // the entry of servers in use
    this.welcome = null;
    this.closed = false;
    this._channel = null;
    this._nextId = 1;
    this._pending = new Map(); // id -> { resolve, reject, frame, resend }
    this._consumers = new Map(); // consumer tag -> Subscription
    this._subscriptions = new Set();
    this._failing = null;
  }

  /** One pass through servers x channels; the reasons when none lets us in. */
  async _open() {
    const reasons = [];
    const { servers, channels } = this.options;
    for (const server of servers) {
      for (const kind of channels) {
        const channel = new CHANNELS[kind](
          server, this.options,
          (frame) => this._frame(channel, frame),
          (reason) => this._lost(channel, reason),
        );
        try {
          const { login, password, vhost, client } = this.options;
          this.welcome = await channel.connect({ m: "hello", id: 0, login, password, vhost, client });
        } catch (error) {
          const where = server || location.origin;
          reasons.push(`${where} (${kind}): ${error.message}`);
          if (error instanceof AmqliteError) {
            if (error.code === NOT_ACTIVE) break; // a passive node: the next server
            const refused = new AmqliteError(`amqlite: ${where} refused: ${error.message}`, error.code);
            refused.final = true;
            throw refused;
          }
          continue; // this channel cannot open here: the next one
        }
        this._channel = channel;
        this.channel = kind;
        this.server = server;
        return;
      }
    }
    throw new Error(`amqlite: no server let us in: ${reasons.join("; ")}`);
  }

  _send(frame) {
    if (this._channel) this._channel.send([frame]);
  }

  _request(frame, resend = false, onok = null) {
    if (this.closed) return Promise.reject(new Error("amqlite: the connection is closed"));
    const id = this._nextId++;
    const full = { ...frame, id };
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject, frame: full, resend, onok });
      this._send(full);
    });
  }

  _frame(channel, frame) {
    if (channel !== this._channel) return;
    switch (frame.m) {
      case "deliver": {
        const sub = this._consumers.get(frame.ctag);
        if (sub) sub.deliver(frame);
        return;
      }
      case "ok":
      case "get-ok":
      case "get-empty":
        this._settle(frame.re, null, frame.info || frame);
        return;
      case "error":
      case "nacked":
      case "returned":
        this._settle(frame.re, new AmqliteError(frame.text || frame.m, frame.code));
        return;
      case "dropped": {
        const sub = this._consumers.get(frame.ctag);
        if (sub) sub.missedSome("dropped", frame.count);
        return;
      }
      case "cancelled": {
        const sub = this._consumers.get(frame.tag);
        if (sub) {
          this._consumers.delete(frame.tag);
          this._subscriptions.delete(sub);
          sub.dispatchEvent(new CustomEvent("cancelled", { detail: { code: frame.code, text: frame.text } }));
        }
        return;
      }
      case "close": // the server closes (shutdown, fencing, the management API)
        channel.close();
        this._lost(channel, `the server closed the session (${frame.code} ${frame.text || ""})`);
        return;
      default:
    }
  }

  _settle(id, error, value) {
    const pending = this._pending.get(id);
    if (!pending) return;
    this._pending.delete(id);
    if (error) {
      pending.reject(error);
    } else {
      if (pending.onok) pending.onok(value);
      pending.resolve(value);
    }
  }

  _lost(channel, reason) {
    if (channel !== this._channel || this.closed) return;
    this._channel = null;
    this._consumers.clear();
    this.dispatchEvent(new CustomEvent("disconnect", { detail: { reason } }));
    for (const [id, pending] of this._pending) {
      if (!pending.resend) {
        this._pending.delete(id);
        pending.reject(new Error(`amqlite: connection lost (${reason})`));
      }
    }
    if (!this._failing) this._failing = this._failover(reason).finally(() => { this._failing = null; });
  }

  async _failover(reason) {
    const until = Date.now() + this.options.failoverTimeout;
    let pause = 100;
    let last = reason;
    while (!this.closed) {
      try {
        await this._open();
      } catch (error) {
        last = error.message;
        if (error.final || Date.now() > until) {
          this._fail(last);
          return;
        }
        await new Promise((r) => setTimeout(r, pause));
        pause = Math.min(pause * 2, 2000);
        continue;
      }
      const channel = this._channel;
      try {
        for (const sub of this._subscriptions) {
          await sub.start();
          if (sub.target.queue === undefined) sub.missedSome("failover", null);
        }
      } catch (error) {
        if (this._channel === channel) {
          this._channel = null;
          channel.close();
        }
        last = error.message;
        continue;
      }
      if (this._channel !== channel) continue; // broke again meanwhile
      const resend = [...this._pending.values()].map((p) => p.frame);
      if (resend.length) channel.send(resend);
      this.dispatchEvent(new CustomEvent("failover", { detail: { server: this.server, channel: this.channel } }));
      return;
    }
  }

  _fail(reason) {
    this.closed = true;
    for (const pending of this._pending.values()) pending.reject(new Error(`amqlite: ${reason}`));
    this._pending.clear();
    this.dispatchEvent(new CustomEvent("closed", { detail: { reason } }));
  }

  /**
   * Publish one message. body: text, bytes (Uint8Array, ArrayBuffer) or anything
   * else as JSON. With { confirm: true } it resolves once the broker holds the
   * message (on disk and on the HA backup when persistent) and rejects on a nack
   * or a refusal; it is sent again after a failover until confirmed.
   */
  async publish(exchange, routingKey, body, { confirm = false, persistent = false, headers = {}, mandatory = false, properties = {} } = {}) {
    const frame = { m: "publish", exchange, key: routingKey };
    const props = { ...properties };
    const bytes = asBytes(body);
    if (typeof body === "string") frame.body = body;
    else if (bytes) frame.body64 = toBase64(bytes);
    else {
      frame.body = JSON.stringify(body);
      props.content_type ??= "application/json";
    }
    if (persistent) props.persistent = true;
    if (Object.keys(props).length) frame.props = props;
    if (headers && Object.keys(headers).length) frame.headers = headers;
    if (mandatory) frame.mandatory = true;
    if (!confirm) {
      if (this.closed) throw new Error("amqlite: the connection is closed");
      this._send({ ...frame, id: this._nextId++ });
      return;
    }
    frame.confirm = true;
    await this._request(frame, true);
  }

  /**
   * Subscribe to { queue } or { exchange, key } (a queue of its own, bound with
   * key, holding at most maxLength messages). callback(msg) gets each message;
   * with { ack: "manual" } call msg.ack(). Resolves once the broker holds it.
   */
  async subscribe(target, callback, options = {}) {
    if (typeof callback !== "function") throw new TypeError("subscribe needs a callback");
    const sub = new Subscription(this, target, callback, options);
    await sub.start();
    this._subscriptions.add(sub);
    return sub;
  }

  /** Close the session; pending requests are rejected. */
  async close() {
    if (this.closed) return;
    this.closed = true;
    const channel = this._channel;
    this._channel = null;
    for (const pending of this._pending.values()) pending.reject(new Error("amqlite: the connection is closed"));
    this._pending.clear();
    if (channel) channel.close();
    this.dispatchEvent(new CustomEvent("closed", { detail: { reason: "closed by the page" } }));
  }
}

/**
 * Connect to the first server of options.servers that lets us in, over the first
 * of options.channels that opens; rejects with an Error naming every reason when
 * none does.
 */
export async function connect(options = {}) {
  const conn = new Connection(options);
  await conn._open();
  return conn;
}
