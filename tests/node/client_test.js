#!/usr/bin/env node
// Proves that a non-Python client can use tiermem with stubs built from proto/ alone.
//
// Usage: node client_test.js HOST:PORT [--ca CA.pem] [--token TOKEN]
//
// With --ca it connects with TLS trusting that CA; with --token every call carries
// `authorization: Bearer TOKEN` (and one call without it must be UNAUTHENTICATED).
//
// Loads proto/tiermem/v1/memory.proto at run time with @grpc/proto-loader (no generated code, no
// Python), then creates, gets, searches, deletes and lists memories against a running server and
// checks the error contract (gRPC status codes plus the google.rpc.Status details). Exits 0 on
// success; any failed check exits non-zero with the failing assertion.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.join(__dirname, '..', '..', 'proto');
const PROTO_FILE = 'tiermem/v1/memory.proto';
const CALL_TIMEOUT_MS = 30000;

let checks = 0;

/** One named check: counts it and prefixes any assertion failure with its name. */
function check(name, fn) {
  try {
    fn();
  } catch (err) {
    err.message = `check failed: ${name}: ${err.message}`;
    throw err;
  }
  checks += 1;
}

function approx(actual, expected, tol, what) {
  assert.equal(typeof actual, 'number', `${what} must be a number, got ${typeof actual} (${actual})`);
  assert.ok(Math.abs(actual - expected) <= tol, `${what}: expected ~${expected}, got ${actual}`);
}

/** Promisify a unary call with a deadline. */
function call(client, method, request) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + CALL_TIMEOUT_MS);
    client[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

/** Run a call that must fail; returns the grpc error. */
async function callExpectingError(client, method, request) {
  try {
    const response = await call(client, method, request);
    assert.fail(`${method} should have failed but returned ${JSON.stringify(response)}`);
  } catch (err) {
    if (err instanceof assert.AssertionError) throw err;
    return err;
  }
  return undefined; // unreachable
}

// --- Minimal protobuf wire decoding of google.rpc.Status (grpc-status-details-bin). -------------
// google/rpc/*.proto is not part of proto/, so decode the few fields the contract promises by hand:
// Status{code=1, message=2, details=3 (Any{type_url=1, value=2})}, ErrorInfo{reason=1, domain=2,
// metadata=3}, BadRequest{field_violations=1 (FieldViolation{field=1, description=2})}.

function decodeFields(buf) {
  const fields = [];
  let pos = 0;
  const varint = () => {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (pos >= buf.length) throw new Error('truncated varint');
      const b = buf[pos++];
      result |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return result;
      shift += 7n;
    }
  };
  while (pos < buf.length) {
    const key = Number(varint());
    const num = key >>> 3;
    const wire = key & 7;
    if (wire === 0) fields.push({ num, value: varint() });
    else if (wire === 2) {
      const len = Number(varint());
      if (pos + len > buf.length) throw new Error('truncated length-delimited field');
      fields.push({ num, value: buf.subarray(pos, pos + len) });
      pos += len;
    } else if (wire === 1) pos += 8;
    else if (wire === 5) pos += 4;
    else throw new Error(`unsupported wire type ${wire}`);
  }
  return fields;
}

const str = (fields, num) => {
  const f = fields.find((x) => x.num === num);
  return f ? Buffer.from(f.value).toString('utf8') : '';
};

function decodeStatusDetails(err) {
  const raw = err.metadata && err.metadata.get('grpc-status-details-bin');
  assert.ok(raw && raw.length === 1, 'error must carry one grpc-status-details-bin trailer');
  const status = decodeFields(raw[0]);
  const codeField = status.find((f) => f.num === 1);
  const out = { code: codeField ? Number(codeField.value) : 0, message: str(status, 2), errorInfo: null, badRequest: null };
  for (const detail of status.filter((f) => f.num === 3)) {
    const any = decodeFields(detail.value);
    const typeUrl = str(any, 1);
    const valueField = any.find((f) => f.num === 2);
    const value = decodeFields(valueField ? valueField.value : Buffer.alloc(0));
    if (typeUrl.endsWith('/google.rpc.ErrorInfo')) {
      out.errorInfo = { reason: str(value, 1), domain: str(value, 2) };
    } else if (typeUrl.endsWith('/google.rpc.BadRequest')) {
      out.badRequest = value
        .filter((f) => f.num === 1)
        .map((f) => {
          const v = decodeFields(f.value);
          return { field: str(v, 1), description: str(v, 2) };
        });
    }
  }
  return out;
}

// -------------------------------------------------------------------------------------------------

async function main() {
  const target = process.argv[2];
  if (!target) {
    console.error('usage: node client_test.js HOST:PORT [--ca CA.pem] [--token TOKEN]');
    process.exit(2);
  }
  const option = (name) => {
    const i = process.argv.indexOf(name);
    return i > 2 ? process.argv[i + 1] : undefined;
  };
  const caFile = option('--ca');
  const token = option('--token');

  const definition = protoLoader.loadSync(PROTO_FILE, {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const proto = grpc.loadPackageDefinition(definition);
  const MemoryService = proto.tiermem.v1.MemoryService;
  check('MemoryService is defined by proto/', () => assert.equal(typeof MemoryService, 'function'));

  const transport = caFile
    ? grpc.credentials.createSsl(require('node:fs').readFileSync(caFile))
    : grpc.credentials.createInsecure();
  if (token) {
    // Call credentials need a secure channel; over plain loopback the token goes in each call's metadata.
    const anonymous = new MemoryService(target, transport);
    const refused = await callExpectingError(anonymous, 'ListNamespaces', {});
    check('a call without the API key is UNAUTHENTICATED', () => {
      assert.equal(refused.code, grpc.status.UNAUTHENTICATED);
      assert.equal(decodeStatusDetails(refused).errorInfo.reason, 'API_KEY_MISSING');
    });
    anonymous.close();
  }
  const bearer = (_params, done) => {
    const md = new grpc.Metadata();
    md.set('authorization', `Bearer ${token}`);
    done(null, md);
  };
  const channelCredentials = token && caFile
    ? grpc.credentials.combineChannelCredentials(transport, grpc.credentials.createFromMetadataGenerator(bearer))
    : transport;
  const options = token && !caFile
    ? { interceptors: [(opts, next) => new grpc.InterceptingCall(next(opts), {
      start: (metadata, listener, nextStart) => {
        metadata.set('authorization', `Bearer ${token}`);
        nextStart(metadata, listener);
      },
    })] }
    : {};
  const client = new MemoryService(target, channelCredentials, options);
  await new Promise((resolve, reject) =>
    client.waitForReady(new Date(Date.now() + CALL_TIMEOUT_MS), (err) =>
      err ? reject(new Error(`cannot connect to ${target}: ${err.message}`)) : resolve()));

  const ns = `node-test:${process.pid}-${Date.now()}/run:${crypto.randomBytes(4).toString('hex')}`;
  const vector = [0.1, 0.2, 0.3, 0.4];

  // --- Create three memories. ---
  const { memory: plain } = await call(client, 'CreateMemory', {
    memory: { namespace: ns, content: 'the quick brown fox jumps over the lazy dog' },
  });
  check('create with content only', () => {
    assert.match(plain.id, /^[0-9a-f]{32}$/, 'server-generated id must be 32 hex digits');
    assert.equal(plain.namespace, ns);
    assert.equal(plain.content, 'the quick brown fox jumps over the lazy dog');
    assert.equal(plain.kind, 'observation');
    assert.equal(plain.tier, 'TIER_SLOW', 'default tier');
    approx(plain.importance, 0.3, 1e-6, 'heuristic importance of a short plain sentence');
    assert.equal(plain.embedding_model, 'tiermem-hash-v1', 'built-in embedder');
    assert.deepEqual(plain.embedding, [], 'embedding is not returned unless asked for');
    assert.ok(plain.create_time && Number(plain.create_time.seconds) > 0, 'create_time is set');
    assert.equal(typeof plain.create_time.seconds, 'string', 'int64 seconds decoded as a string (longs: String)');
    assert.equal(plain.access_count, '0');
  });

  const { memory: vec } = await call(client, 'CreateMemory', {
    memory: { namespace: ns, content: 'a memory with its own vector', embedding: vector, embedding_model: 'node-test' },
  });
  check('create with explicit embedding', () => {
    assert.match(vec.id, /^[0-9a-f]{32}$/);
    assert.equal(vec.embedding_model, 'node-test');
    assert.notEqual(vec.id, plain.id);
  });

  const { memory: rich } = await call(client, 'CreateMemory', {
    memory: {
      namespace: ns,
      content: 'deploy pipeline failed on the staging cluster',
      kind: 'fact',
      tags: ['deploy', 'staging'],
      metadata: { n: { int_value: 7 } },
      importance: 0.9,
      tier: 'TIER_FAST',
    },
  });
  check('create with tags, metadata, importance and tier', () => {
    assert.deepEqual(rich.tags, ['deploy', 'staging']);
    assert.equal(rich.tier, 'TIER_FAST');
    assert.equal(rich.kind, 'fact');
    approx(rich.importance, 0.9, 1e-6, 'importance');
    assert.ok(rich.metadata.n, 'metadata key n is returned');
    assert.equal(rich.metadata.n.kind, 'int_value', 'metadata oneof case');
    assert.equal(rich.metadata.n.int_value, '7', 'metadata int64 value');
  });

  // --- Get one back, with its embedding. ---
  const { memory: got } = await call(client, 'GetMemory', { namespace: ns, id: vec.id, include_embedding: true });
  check('get returns the stored memory with its normalized embedding', () => {
    assert.equal(got.id, vec.id);
    assert.equal(got.content, 'a memory with its own vector');
    assert.equal(got.embedding_model, 'node-test');
    assert.equal(got.embedding.length, 4, 'embedding dimension');
    const norm = Math.sqrt(vector.reduce((s, x) => s + x * x, 0));
    got.embedding.forEach((x, i) => approx(x, vector[i] / norm, 1e-5, `embedding[${i}]`));
  });

  // --- Search by text (built-in space) and by vector (node-test space). ---
  const scoreParts = (r, what) => {
    for (const key of ['score', 'relevance', 'recency', 'importance']) {
      assert.equal(typeof r[key], 'number', `${what}: result.${key} must be present`);
      assert.ok(Number.isFinite(r[key]), `${what}: result.${key} must be finite`);
    }
    assert.ok(r.recency >= 0 && r.recency <= 1, `${what}: recency in [0, 1]`);
  };

  const byText = await call(client, 'SearchMemories', { namespaces: [ns], query_text: 'quick brown fox lazy dog' });
  check('search by query_text ranks the matching memory first', () => {
    assert.ok(byText.results.length >= 1, 'at least one result');
    assert.equal(byText.results[0].memory.id, plain.id);
    byText.results.forEach((r, i) => scoreParts(r, `text result ${i}`));
    assert.ok(byText.results[0].relevance > 0.5, `relevance of the match is high (${byText.results[0].relevance})`);
    for (let i = 1; i < byText.results.length; i++) {
      assert.ok(byText.results[i - 1].score >= byText.results[i].score, 'results ordered by descending score');
    }
    const ids = byText.results.map((r) => r.memory.id);
    assert.ok(!ids.includes(vec.id), 'a memory of another embedding space is never compared');
  });

  const byVector = await call(client, 'SearchMemories', {
    namespaces: [ns], query_embedding: vector, embedding_model: 'node-test', limit: 5,
  });
  check('search by query_embedding ranks the matching memory first', () => {
    assert.ok(byVector.results.length >= 1, 'at least one result');
    assert.equal(byVector.results[0].memory.id, vec.id);
    byVector.results.forEach((r, i) => scoreParts(r, `vector result ${i}`));
    approx(byVector.results[0].relevance, 1, 1e-4, 'relevance of an identical vector');
  });

  // --- A bad request fails with INVALID_ARGUMENT and the documented details. ---
  const bad = await callExpectingError(client, 'CreateMemory', {
    memory: { namespace: ns, content: 'too important', importance: 1.5 },
  });
  check('importance 1.5 is INVALID_ARGUMENT', () => {
    assert.equal(bad.code, grpc.status.INVALID_ARGUMENT, `status code (${bad.code}: ${bad.details})`);
    assert.equal(bad.code, 3);
  });
  check('INVALID_ARGUMENT carries ErrorInfo and BadRequest naming the field', () => {
    const st = decodeStatusDetails(bad);
    assert.equal(st.code, 3, 'google.rpc.Status code');
    assert.ok(st.errorInfo, 'ErrorInfo detail present');
    assert.equal(st.errorInfo.domain, 'tiermem');
    assert.ok(st.errorInfo.reason.length > 0, 'ErrorInfo reason set');
    assert.ok(st.badRequest && st.badRequest.length >= 1, 'BadRequest detail present');
    assert.equal(st.badRequest[0].field, 'memory.importance');
  });

  // --- Delete, then get is NOT_FOUND. ---
  await call(client, 'DeleteMemory', { namespace: ns, id: plain.id });
  const gone = await callExpectingError(client, 'GetMemory', { namespace: ns, id: plain.id });
  check('get after delete is NOT_FOUND', () => {
    assert.equal(gone.code, grpc.status.NOT_FOUND, `status code (${gone.code}: ${gone.details})`);
    assert.equal(gone.code, 5);
    const st = decodeStatusDetails(gone);
    assert.equal(st.errorInfo && st.errorInfo.reason, 'MEMORY_NOT_FOUND');
    assert.equal(st.errorInfo.domain, 'tiermem');
  });

  // --- List the namespace. ---
  const listed = await call(client, 'ListMemories', { namespace: ns });
  check('list returns the remaining memories in creation order', () => {
    assert.deepEqual(listed.memories.map((m) => m.id), [vec.id, rich.id]);
    assert.equal(listed.next_page_token, '');
    assert.deepEqual(listed.memories[1].tags, ['deploy', 'staging']);
    assert.equal(listed.memories[1].metadata.n.int_value, '7');
  });

  client.close();
  console.log(`node client: OK (${checks} checks) against ${target}, namespace ${ns}`);
}

main().catch((err) => {
  console.error(`node client: FAILED: ${err && err.message ? err.message : err}`);
  if (err && err.stack) console.error(err.stack);
  process.exit(1);
});
