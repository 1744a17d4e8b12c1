// Reference JavaScript clients for the interop suite, driven by pytest:
//   node client.js '<json spec>'
// spec: {lib: "mqtt"|"stomp"|"rhea", mode: "pub"|"sub"|"connect",
//        host, port, address, payloads: [base64...], count, user, password,
//        clientId, clean, durable, props: {k: v}, text, timeoutMs, version,
//        filter: {k: v} (rhea "sub": the source's filter set)}
// Prints one JSON line: {ok, received: [{body: base64, props, fields}], error}.
// "sub" prints {"ready": true} on its own line once subscribed, so the
// caller can start publishing.
'use strict';

const spec = JSON.parse(process.argv[2]);
const timeoutMs = spec.timeoutMs || 15000;
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const done = (o) => { out(o); process.exit(o.ok ? 0 : 1); };
setTimeout(() => done({ ok: false, error: 'timeout', received }), timeoutMs);
const received = [];
const payloads = (spec.payloads || []).map((p) => Buffer.from(p, 'base64'));
const want = spec.count !== undefined ? spec.count : payloads.length;

function finishIfDone(close) {
  if (spec.mode === 'sub' && received.length >= want) {
    Promise.resolve(close()).finally(() => done({ ok: true, received }));
  }
}

// ------------------------------------------------------------------ mqtt.js
function runMqtt() {
  const mqtt = require('mqtt');
  const opts = {
    host: spec.host, port: spec.port, protocolVersion: spec.version || 5,
    clientId: spec.clientId || `mqttjs-${process.pid}-${Date.now()}`,
    clean: spec.clean !== false, reconnectPeriod: 0, connectTimeout: 5000,
  };
  if (spec.user) { opts.username = spec.user; opts.password = spec.password; }
  if (opts.protocolVersion === 5 && spec.sessionExpiry) {
    opts.properties = { sessionExpiryInterval: spec.sessionExpiry };
  }
  const c = mqtt.connect(opts);
  c.on('error', (e) => done({ ok: false, error: String(e.message || e), code: e.code }));
  c.on('message', (topic, payload, packet) => {
    const p = packet.properties || {};
    received.push({
      body: payload.toString('base64'),
      props: p.userProperties || {},
      fields: { topic, qos: packet.qos, dup: packet.dup, payloadFormatIndicator: p.payloadFormatIndicator,
                contentType: p.contentType, responseTopic: p.responseTopic },
    });
    finishIfDone(() => c.endAsync());
  });
  c.on('connect', async (connack) => {
    if (spec.mode === 'connect') { await c.endAsync(); return done({ ok: true, sessionPresent: connack.sessionPresent }); }
    if (spec.mode === 'sub') {
      await c.subscribeAsync(spec.address, { qos: 1 });
      out({ ready: true, sessionPresent: connack.sessionPresent });
      if (spec.disconnectAfterSubscribe) { await c.endAsync(); return done({ ok: true, received }); }
      finishIfDone(() => c.endAsync());
    } else {
      for (const body of payloads) {
        const props = {};
        if (spec.props) props.userProperties = spec.props;
        if (spec.text) props.payloadFormatIndicator = true;
        await c.publishAsync(spec.address, body, { qos: 1, properties: opts.protocolVersion === 5 ? props : undefined });
      }
      await c.endAsync();
      done({ ok: true, sent: payloads.length });
    }
  });
}

// ---------------------------------------------------------------- stompjs
function runStomp() {
  Object.assign(global, { WebSocket: require('ws') });
  const { Client } = require('@stomp/stompjs');
  const net = require('net');
  // stompjs speaks over a WebSocket-like object; this one wraps a TCP socket
  // so the reference client talks to the plain STOMP listener.
  class TcpSocket {
    constructor() {
      this.readyState = 0; this.binaryType = 'arraybuffer'; this.protocol = '';
      this.sock = net.connect(spec.port, spec.host, () => { this.readyState = 1; this.onopen && this.onopen(); });
      this.sock.on('data', (d) => this.onmessage && this.onmessage({ data: d.buffer.slice(d.byteOffset, d.byteOffset + d.length) }));
      this.sock.on('close', () => { this.readyState = 3; this.onclose && this.onclose({ code: 1000, reason: '' }); });
      this.sock.on('error', (e) => this.onerror && this.onerror(e));
    }
    send(data) { this.sock.write(typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data)); }
    close() { this.readyState = 2; this.sock.end(); }
    terminate() { this.sock.destroy(); }
  }
  const headers = {};
  if (spec.user) { headers.login = spec.user; headers.passcode = spec.password; }
  if (spec.clientId) headers['client-id'] = spec.clientId;
  const client = new Client({
    webSocketFactory: () => new TcpSocket(), connectHeaders: headers, reconnectDelay: 0,
    heartbeatIncoming: 0, heartbeatOutgoing: 0, forceBinaryWSFrames: true, appendMissingNULLonIncoming: false,
    stompVersions: new (require('@stomp/stompjs').Versions)([spec.version || '1.2']),
  });
  client.onStompError = (f) => done({ ok: false, error: f.headers.message || 'ERROR frame', headers: f.headers });
  let finishing = false;
  client.onWebSocketClose = () => { if (spec.mode !== 'pub' && !finishing) done({ ok: false, error: 'closed', received }); };
  client.onConnect = async () => {
    if (spec.mode === 'connect') { finishing = true; await client.deactivate(); return done({ ok: true }); }
    if (spec.mode === 'sub') {
      const subHeaders = { ack: 'client-individual', receipt: 'sub-1' };
      if (spec.durable) { subHeaders['activemq.subscriptionName'] = spec.durable; }
      client.watchForReceipt('sub-1', () => {
        out({ ready: true });
        if (spec.disconnectAfterSubscribe) { finishing = true; client.deactivate().finally(() => done({ ok: true, received })); }
      });
      client.subscribe(spec.address, (m) => {
        received.push({ body: Buffer.from(m.binaryBody).toString('base64'), props: m.headers, fields: {} });
        m.ack();
        if (received.length >= want) {
          finishing = true;
          client.watchForReceipt('done', () => { client.deactivate().finally(() => done({ ok: true, received })); });
          client.publish({ destination: '/queue/ignored-noop', body: '', headers: { receipt: 'done' } });
        }
      }, subHeaders);
    } else {
      let n = 0;
      for (const body of payloads) {
        const h = Object.assign({ persistent: 'true', 'content-type': spec.text ? 'text/plain' : 'application/octet-stream' }, spec.props || {});
        const rid = `r${n++}`;
        h.receipt = rid;
        await new Promise((resolve) => { client.watchForReceipt(rid, resolve); client.publish({ destination: spec.address, binaryBody: body, headers: h }); });
      }
      await client.deactivate();
      done({ ok: true, sent: payloads.length });
    }
  };
  client.activate();
}

// ------------------------------------------------------------------- rhea
function runRhea() {
  const rhea = require('rhea');
  const container = rhea.create_container({ id: spec.clientId || `rhea-${process.pid}` });
  const opts = { host: spec.host, port: spec.port, reconnect: false };
  if (spec.user) { opts.username = spec.user; opts.password = spec.password; }
  const conn = container.connect(opts);
  conn.on('connection_error', (ctx) => done({ ok: false, error: String((ctx.connection.error || {}).condition || 'connection error') }));
  conn.on('disconnected', (ctx) => { if (!finished) done({ ok: false, error: `disconnected: ${ctx.error || ''}`, received }); });
  conn.on('error', (ctx) => done({ ok: false, error: String(ctx.error || 'error') }));
  let finished = false;
  const finish = (o) => { finished = true; conn.close(); conn.once('connection_close', () => done(o)); setTimeout(() => done(o), 2000); };
  conn.on('connection_open', () => {
    if (spec.mode === 'connect') return finish({ ok: true });
    if (spec.mode === 'sub') {
      const source = { address: spec.address };
      if (spec.durable) { source.durable = 2; source.expiry_policy = 'never'; }
      if (spec.filter) source.filter = spec.filter;
      const r = conn.open_receiver({ source, name: spec.durable || undefined, autoaccept: true, credit_window: 100 });
      r.on('receiver_open', () => {
        out({ ready: true });
        if (spec.disconnectAfterSubscribe) { finished = true; r.detach(); return finish({ ok: true, received }); }
      });
      r.on('message', (ctx) => {
        const m = ctx.message;
        let body = m.body;
        let kind = 'value';
        if (body && body.typecode === 0x75) { body = body.content; kind = 'data'; }
        else if (typeof body === 'string') { body = Buffer.from(body, 'utf8'); kind = 'string'; }
        else if (Buffer.isBuffer(body)) { kind = 'binary-value'; }
        else body = Buffer.from(JSON.stringify(body));
        // Message annotations as JSON: an AMQP timestamp (a Date here) as
        // its milliseconds.
        const annotations = {};
        for (const [k, v] of Object.entries(m.message_annotations || {})) {
          annotations[k] = v instanceof Date ? { timestamp_ms: v.getTime() } : v;
        }
        received.push({ body: Buffer.from(body).toString('base64'), props: m.application_properties || {}, fields: { kind, durable: m.durable, subject: m.subject, annotations } });
        if (received.length >= want && !finished) finish({ ok: true, received });
      });
    } else {
      const s = conn.open_sender(spec.address);
      let settled = 0, n = 0;
      s.on('accepted', () => { settled++; if (settled === payloads.length) finish({ ok: true, sent: settled }); });
      s.on('rejected', (ctx) => done({ ok: false, error: 'rejected' }));
      s.on('sendable', () => {
        while (s.sendable() && n < payloads.length) {
          const body = spec.text ? payloads[n].toString('utf8') : rhea.message.data_section(payloads[n]);
          s.send({ body, durable: true, application_properties: spec.props || undefined });
          n++;
        }
      });
      if (payloads.length === 0) finish({ ok: true, sent: 0 });
    }
  });
}

({ mqtt: runMqtt, stomp: runStomp, rhea: runRhea })[spec.lib]();
