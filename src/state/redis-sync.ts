// The background exchange with Redis: every tick, ONE script call (one round trip) publishes this
// instance's in-flight part (snapshot.ts) with a heartbeat, drops instances whose heartbeat is
// older than the liveness TTL, and returns the live peers' in-flight parts; in the same call it
// appends this instance's new entries to the shared log (a capped stream: the prefix blocks each
// instance has sent to backends since its last tick, src/state/prefix-index.ts) and returns the
// log's entries it has not read yet, so deltas travel, never the whole index, and an instance that
// joins late reads the log's history. A tick half a refresh interval after the last full exchange
// also publishes the full snapshot and returns the peers' (the large part, which changes slowly):
//
//   every inflight_interval_ms / 2:   heartbeat, in-flight parts, prefix log
//   every refresh_interval_ms / 2:    the same, and the full snapshots
//
// An instance that leaves (close(), or its heartbeat expired) leaves its tenants' tokens of the last
// minute behind, in inflight-free form, for a minute: they were spent, and a tenant's
// tokens_per_minute holds over a rolling restart. The full exchange returns them with the peers'.
//
// Invariants:
// - nothing on the request path waits for this: the tick runs on a timer and only ever replaces
//   the peers' view when it succeeds;
// - at most one tick is in flight, and every await in it is bounded (command or connect timeout),
//   so a hung Redis delays the view, never the process;
// - at most one script is pending on the connection: a script call that gets no answer (a timeout
//   above all) drops the connection with it, and the client reconnects; one Redis answers with an
//   error does not (nothing is pending, and a new connection would get the same answer). A timeout only stops the
//   waiting; the command itself would stay queued in the client and on the socket, the next tick
//   would queue another behind it, each carrying the unsent entry, and a Redis that stalled for
//   longer than a few ticks would, on waking, run that whole backlog and answer with replies that
//   time out in turn. What a dropped connection held is never resent (redis-client.ts), and no
//   log entry is ever sent twice;
// - the shared log is optional: its commands run under pcall, so a log key of the wrong type or a
//   command Redis refuses costs the peers the prefix blocks, never the snapshots; and it reads from
//   the last id it read, dropping that entry itself (no exclusive range: Redis 5.0 streams do);
// - a read that timed out is retried smaller: each failed call halves the log entries asked for
//   (down to one), each success doubles them back, so a backlog too big to send within the command
//   timeout is still read, in parts; and no read returns more than LOG_READ_BYTES of entries
//   beyond its first, so what one tick parses on the event loop is bounded in bytes, not only in
//   entries;
// - every key is hash-tagged `{prefix}` (one Cluster slot), declared in KEYS, bounded in size by
//   the live instances and expired by PEXPIRE when no instance is left to refresh it;
// - liveness is judged on Redis' own clock (TIME), so gateway clocks need not agree.

import { ReplyError } from 'ioredis';
import type { RedisStateConfig } from '../config/index.ts';
import { createRedisClient, type StateRedisClient } from './redis-client.ts';

/** Live instances kept at most; the oldest heartbeats go first (a bound, not a limit in practice). */
const MAX_INSTANCES = 256;

/** A write refused by a replica, whether Redis gives it bare (7+) or inside a script's error (≤6.2). */
export const READONLY = /(?:^|-)READONLY /;

// KEYS: instances (heartbeats), full snapshots, log, in-flight parts, departed instances' tenant
// tokens (id → "<redis ms>|<snapshot of tenants only, none in flight>"). ARGV[2] is the full
// snapshot, '' on a tick that does not exchange it (then no peer's is read either); ARGV[11] the
// in-flight part; ARGV[12] how long a departed instance's tokens count (ms).
// The heartbeat is written after both parts: Redis does not undo a script that fails half-way, and
// a heartbeat refreshed over a part that could not be written would have the peers count this
// instance's old leases for as long as the failure lasts; without it they drop them after the TTL.
const SYNC_SCRIPT = `
local t = redis.call('TIME')
local logged = {}
local logErr = ''
if ARGV[5] ~= '' then
  local r = redis.pcall('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'i', ARGV[1], 'p', ARGV[5])
  if type(r) == 'table' and r.err then
    logErr = r.err
    -- Over maxmemory (noeviction) the append is refused, and with it the only trim the log had:
    -- it gives up its older half instead (a trim frees memory and is never refused), tick after
    -- tick, until appends fit again. The log is what the exchange can lose; the snapshots are not.
    if string.find(logErr, 'OOM', 1, true) then
      local len = redis.pcall('XLEN', KEYS[3])
      if type(len) == 'number' and len > 0 then redis.pcall('XTRIM', KEYS[3], 'MAXLEN', math.floor(len / 2)) end
    end
  end
end
if logErr == '' then
  local from = ARGV[6]
  local want = tonumber(ARGV[8])
  local r = redis.pcall('XRANGE', KEYS[3], from, '+', 'COUNT', want + 1)
  if type(r) == 'table' and r.err then
    logErr = r.err
  else
    logged = r
    if from ~= '-' and #logged > 0 and logged[1][1] == from then
      table.remove(logged, 1)
    elseif #logged > want then
      logged[#logged] = nil
    end
    local budget = tonumber(ARGV[10])
    local bytes = 0
    for i = 1, #logged do
      local f = logged[i][2]
      for j = 2, #f, 2 do bytes = bytes + #f[j] end
      if bytes > budget and i > 1 then
        for k = #logged, i, -1 do logged[k] = nil end
        break
      end
    end
    redis.pcall('PEXPIRE', KEYS[3], ARGV[9])
  end
end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local max = tonumber(ARGV[4])
local keep = tonumber(ARGV[12])
local function depart(id, snap, at)
  if not snap or keep <= 0 or at < now - keep then return end
  local ok, d = pcall(cjson.decode, snap)
  if not ok or type(d) ~= 'table' or type(d.t) ~= 'table' then return end
  local tenants = {}
  local any = false
  for name, c in pairs(d.t) do
    if type(c) == 'table' and type(c[2]) == 'number' and c[2] > 0 then
      tenants[name] = {0, c[2]}
      any = true
    end
  end
  if not any or redis.call('HLEN', KEYS[5]) >= max then return end
  redis.call('HSET', KEYS[5], id, at .. '|' .. cjson.encode({v = d.v, b = {}, t = tenants}))
  redis.call('PEXPIRE', KEYS[5], keep)
end
local cutoff = '(' .. (now - ttl)
-- A heartbeat later than Redis' now was scored by another server's clock (a failover to a replica
-- whose clock is behind): it ages from now. Otherwise a dead instance would count on for as long
-- as the two clocks differ, not the TTL. (Under pcall: rare, and a Redis over maxmemory may refuse
-- a script's first write.)
local ahead = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for i = 1, #ahead do redis.pcall('ZADD', KEYS[1], 'XX', now, ahead[i]) end
-- Each with its last heartbeat: its tokens count from then, whoever finds it dead and when.
-- Its entries are deleted before its departed entry is written: Redis over maxmemory refuses a
-- script's first write that may add memory (and the script with it), so the HSET must not be the
-- first write when the log's append was refused, or one crashed peer would stop every exchange.
-- The snapshots' hash is touched under pcall on a tick that does not exchange them: a key Redis
-- refuses there (of another type) costs the full exchange, never the in-flight parts and the sweep.
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'WITHSCORES')
for i = 1, #dead, 2 do
  local snap = redis.pcall('HGET', KEYS[2], dead[i])
  if type(snap) ~= 'string' then snap = nil end
  redis.pcall('HDEL', KEYS[2], dead[i])
  redis.call('HDEL', KEYS[4], dead[i])
  depart(dead[i], snap, tonumber(dead[i + 1]))
end
-- An instance judged dead that comes back counts its own tokens again.
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
local full = ARGV[2] ~= ''
if full then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[11])
redis.call('ZADD', KEYS[1], now, ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n > max then
  local extra = redis.call('ZRANGE', KEYS[1], 0, n - max - 1)
  for i = 1, #extra do
    redis.pcall('HDEL', KEYS[2], extra[i])
    redis.call('HDEL', KEYS[4], extra[i])
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - max - 1)
end
-- The heartbeats and full snapshots outlive the last instance for as long as its tenants' tokens
-- count, so that a successor started after a crash of every instance still finds them (and drops
-- the dead, their windows unread, at its first tick); the in-flight parts go with the TTL.
redis.call('PEXPIRE', KEYS[1], math.max(ttl, keep))
if full then redis.call('PEXPIRE', KEYS[2], math.max(ttl, keep)) end
redis.call('PEXPIRE', KEYS[4], ttl)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
local counts = {}
local function add(into, key, id)
  local v = redis.call('HGET', key, id)
  if v then
    into[#into + 1] = id
    into[#into + 1] = v
  end
end
for i = 1, #live do
  if live[i] ~= ARGV[1] then
    if full then add(out, KEYS[2], live[i]) end
    add(counts, KEYS[4], live[i])
  end
end
local departed = {}
if full then
  local all = redis.call('HGETALL', KEYS[5])
  for i = 1, #all, 2 do
    local v = all[i + 1]
    local sep = string.find(v, '|', 1, true)
    local at = sep and tonumber(string.sub(v, 1, sep - 1))
    if not at or at < now - keep then
      redis.call('HDEL', KEYS[5], all[i])
    else
      -- Written by another server's clock, ahead of this one's (as for the heartbeats): from now.
      if at > now then redis.pcall('HSET', KEYS[5], all[i], now .. string.sub(v, sep)) end
      departed[#departed + 1] = string.sub(v, sep + 1)
    end
  end
end
return {out, logged, logErr, counts, full and 1 or 0, departed}
`;

// close(): withdraws this instance, leaving its tenants' tokens (ARGV[2], '' when none) behind as a
// departed instance's (the sync script's KEYS and layout).
const LEAVE_SCRIPT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local keep = tonumber(ARGV[3])
if ARGV[2] ~= '' and keep > 0 and redis.call('HLEN', KEYS[5]) < tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[5], ARGV[1], now .. '|' .. ARGV[2])
  redis.call('PEXPIRE', KEYS[5], keep)
end
return 1
`;

/** Both scripts' KEYS, in their order. */
type ScriptKeys = [instances: string, snapshots: string, log: string, inflight: string, departed: string];

interface SyncCommand {
  slagateSync(
    ...args: [
      ...keys: ScriptKeys,
      id: string,
      snapshot: string,
      ttlMs: number,
      max: number,
      logEntry: string,
      logFrom: string,
      logMaxLen: number,
      logCount: number,
      logTtlMs: number,
      logReadBytes: number,
      inflightPart: string,
      departedMs: number,
    ]
  ): Promise<unknown>;
  slagateLeave(
    ...args: [...keys: ScriptKeys, id: string, tenants: string, departedMs: number, max: number]
  ): Promise<unknown>;
}

/**
 * An entry over this is not sent. One drain of the prefix index tells at most MAX_TOLD_BLOCKS,
 * which encode well below it, so only a pathological entry (a backend name of megabytes) is ever
 * dropped here.
 */
const MAX_ENTRY_CHARS = 1 << 20;
/**
 * Entries the shared log keeps (about: Redis trims in whole nodes) per full-snapshot interval's
 * worth of ticks: an instance adds at most one entry a tick, so the log spans the same time
 * whatever the pace of the ticks (about 250 s ÷ the instances telling, by default).
 */
const LOG_LEN_PER_FULL_INTERVAL = 1_000;
/** …and at most this many in all: each entry may be large (MAX_ENTRY_CHARS), and fast ticks would otherwise multiply the bound. */
const LOG_MAX_LEN = 10_000;
/** Entries read per tick at most: a late joiner catches up over several ticks. */
const LOG_READ = 250;
/**
 * Bytes of entries read per tick at most (at least one entry is read, and one is at most
 * MAX_ENTRY_CHARS): 250 entries each as large as an instance that was cut off for a while sends
 * would be a reply of hundreds of MiB, parsed and decoded in one go on the event loop.
 */
export const LOG_READ_BYTES = MAX_ENTRY_CHARS;
/** The log outlives its writers by this much (a restart within it relearns the index). */
const LOG_TTL_MS = 10 * 60_000;

export interface StateLogger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

export interface StoreStatus {
  store: 'memory' | 'redis';
  /**
   * True while the shared store is unreachable (or not reached yet): local state is serving; and
   * from a failed full exchange until one passes (in-flight-only exchanges may pass meanwhile).
   */
  degraded: boolean;
  /** The error since the last successful exchange (a full one, after a full one failed); null once one succeeds. */
  lastError: string | null;
  /** Time since the last exchange that passed, of either kind; null if none yet (or with the memory store). */
  lastSyncAgeMs: number | null;
  /** How long the last exchange took (success or failure). */
  lastSyncDurationMs: number | null;
  /**
   * Live peer instances the last exchange counted, while it is within the liveness TTL (they are
   * kept that long through an outage: live-state.ts); while full exchanges fail, their in-flight
   * parts alone may be in the view (their snapshots go at the TTL).
   */
  peers: number;
  /** The shared prefix log's last error (the rest is shared all the same); null when none. */
  logError: string | null;
}

export interface SyncHost {
  /** This instance's full snapshot as of `now` (called on the ticks that exchange it). */
  snapshot(now: number): string;
  /** This instance's in-flight part (called once per tick). */
  inflight(): string;
  /**
   * Replaces the peers' part of the view: their in-flight parts, and their full snapshots when
   * this tick exchanged them (null when it did not: the last ones stand). Returns how many peers
   * the in-flight parts counted.
   */
  applyPeers(snapshots: string[] | null, inflight: string[], now: number): number;
  /** This instance's new log entry since the last tick, '' when it has none (called once per tick). */
  logEntry(): string;
  /** Entries other instances added to the log, oldest first. */
  applyLog(entries: string[]): void;
  /**
   * What this instance leaves behind when it closes: a full snapshot of its tenants' tokens only,
   * none in flight; '' when it has none.
   */
  departing(now: number): string;
}

export interface RedisSyncOptions {
  instanceId: string;
  host: SyncHost;
  now: () => number;
  logger?: StateLogger | undefined;
  /** How long a departed instance's tenant tokens still count; default the token window (60 s). */
  departedMs?: number | undefined;
}

/** The tenants' token window (tenants.ts): how long a departed instance's tokens count by default. */
const DEPARTED_MS = 60_000;

/** The sync period: half the in-flight interval, at most half the refresh interval (see the constructor). */
export function tickIntervalMs(cfg: RedisStateConfig): number {
  return Math.max(5, Math.floor(Math.min(cfg.inflight_interval_ms, cfg.refresh_interval_ms) / 2));
}

/** How often the full snapshots are exchanged: half the refresh interval (see the constructor). */
function fullIntervalMs(cfg: RedisStateConfig): number {
  return Math.max(5, Math.floor(cfg.refresh_interval_ms / 2));
}

/** The shared log's length: LOG_LEN_PER_FULL_INTERVAL for each full interval's ticks, at most LOG_MAX_LEN. */
function logMaxLen(cfg: RedisStateConfig): number {
  return Math.min(
    LOG_MAX_LEN,
    Math.ceil((LOG_LEN_PER_FULL_INTERVAL * fullIntervalMs(cfg)) / tickIntervalMs(cfg)),
  );
}

/**
 * How long a silent instance still counts: a few refresh intervals (a slow tick or a GC pause is not
 * a death), at least 1 s, at most 4 s, so that with refresh intervals up to ~1 s a killed gateway
 * stops counting everywhere within 5 s (TTL + the reader's own refresh).
 */

export function livenessTtlMs(cfg: RedisStateConfig): number {
  const clamped = Math.min(4_000, Math.max(1_000, 4 * cfg.refresh_interval_ms));
  return Math.max(clamped, 2 * cfg.refresh_interval_ms + cfg.command_timeout_ms);
}

export class RedisSync {
  readonly ttlMs: number;
  readonly keys: { instances: string; snapshots: string; log: string; inflight: string; departed: string };
  readonly client: StateRedisClient;
  readonly #cfg: RedisStateConfig;
  readonly #opts: RedisSyncOptions;
  readonly #timer: NodeJS.Timeout;
  #busy: Promise<void> | null = null;
  #closed = false;
  #degraded = true;
  #lastError: string | null = 'not connected yet';
  #lastOkAt: number | null = null;
  #lastDurationMs: number | null = null;
  #peers = 0;
  /** When the full snapshots were last exchanged (null: due at the next tick). */
  #fullAt: number | null = null;
  /**
   * Full exchanges that failed in a row (0 once one passes), and when (performance.now()) the next
   * may be tried. Invariant: the in-flight counts travel even when the full exchange cannot (peers'
   * snapshots too large to come back within the command timeout, a snapshots key Redis refuses):
   * after a failed full exchange the ticks carry the in-flight parts alone until the full one is
   * tried again, a full interval later after the first failure and twice as long after each one
   * after it, up to the liveness TTL. Without the in-flight-only ticks every tick after a failure
   * was full (nothing had succeeded since the last full exchange), and each failed the same way;
   * without the backoff, a full exchange that timed out was tried again every few ticks, each
   * time making Redis build every peer's snapshot for a reply nobody read, and dropping the
   * connection the in-flight counts travel on (a few reconnections a second per instance).
   */
  #fullFailures = 0;
  #fullRetryAt = 0;
  /**
   * A full exchange failed and none has passed since: the store stays degraded, though the
   * in-flight-only ticks between pass (the peers' windows, fits and tenants are not current).
   * So after an outage whose last failed call was full, the degraded state ends with the first
   * full exchange after its backoff (#fullRetryAt), the ticks before it in-flight-only: the full
   * exchange's own failure and an outage look alike from here, and telling them apart broke the
   * alternation that lets the counts travel.
   */
  #fullOwed = false;
  /** The peers whose full snapshot and in-flight part the last full exchange brought. */
  #inFull: string[] = [];
  /** The id of the last log entry read ('-': none yet, so the first tick reads the history). */
  #logFrom = '-';
  /** Log entries asked for per tick: LOG_READ, less after a failed call (see the invariants). */
  #logRead = LOG_READ;
  /** Why the connection was dropped, until it has closed: ticks meanwhile fail with it, sending nothing. */
  #dropped: string | null = null;
  /** Connections that have become ready: which one a call went out on. */
  #connections = 0;
  /** The log's last error (the snapshots are exchanged all the same), or null. */
  #logError: string | null = null;
  #resolveReady!: () => void;
  readonly #ready = new Promise<void>((resolve) => {
    this.#resolveReady = resolve;
  });

  constructor(cfg: RedisStateConfig, opts: RedisSyncOptions) {
    this.#cfg = cfg;
    this.#opts = opts;
    this.ttlMs = livenessTtlMs(cfg);
    const tag = `{${cfg.key_prefix}}`;
    this.keys = {
      instances: `${tag}:instances`,
      snapshots: `${tag}:snapshots`,
      log: `${tag}:log`,
      inflight: `${tag}:inflight`,
      departed: `${tag}:departed`,
    };
    this.client = createRedisClient(cfg);
    this.client.defineCommand('slagateSync', { numberOfKeys: 5, lua: SYNC_SCRIPT });
    this.client.defineCommand('slagateLeave', { numberOfKeys: 5, lua: LEAVE_SCRIPT });
    // Without a listener ioredis reports every failed reconnect as an unhandled error.
    this.client.on('error', (e: Error) => {
      this.#lastError = e.message;
    });
    this.client.on('close', () => {
      this.#dropped = null;
    });
    // Reconnected: publish everything at once rather than at the next interval.
    this.client.on('ready', () => {
      this.#connections++;
      this.#dropped = null;
      this.#fullAt = null;
      void this.tick();
    });
    // Every exchange both publishes and reads, so a change waits at most one tick here and one on
    // the peer: ticking at half an interval keeps that within the interval, for the in-flight parts
    // (inflight_interval_ms) and the full snapshots (refresh_interval_ms) alike.
    this.#timer = setInterval(() => void this.tick(), tickIntervalMs(cfg));
    this.#timer.unref();
    void this.tick();
  }

  /** Resolves once the first exchange has succeeded or failed. */
  ready(): Promise<void> {
    return this.#ready;
  }

  status(): StoreStatus {
    return {
      store: 'redis',
      degraded: this.#degraded,
      lastError: this.#lastError,
      lastSyncAgeMs: this.#lastOkAt === null ? null : Math.max(0, this.#opts.now() - this.#lastOkAt),
      lastSyncDurationMs: this.#lastDurationMs,
      peers: this.#peers,
      logError: this.#logError,
    };
  }

  /** One exchange; a no-op while another is in flight. */
  tick(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    if (this.#busy === null) {
      this.#busy = this.#exchange().finally(() => {
        this.#busy = null;
        this.#resolveReady();
      });
    }
    return this.#busy;
  }

  async #exchange(): Promise<void> {
    const { now } = this.#opts;
    const started = performance.now();
    try {
      const client = this.client;
      if (client.status === 'wait') {
        await bounded(
          client.connect(),
          this.#cfg.connect_timeout_ms + this.#cfg.command_timeout_ms,
          'connect',
        );
      }
      if (this.#dropped !== null) throw new Error(`${this.#dropped} (reconnecting)`);
      if (client.status !== 'ready') throw new Error(`redis connection ${client.status}`);
      const connection = this.#connections;
      const at = now();
      // Due half a tick early: ticks drift by a fraction of a millisecond, and one that came 249 ms
      // after the last full exchange would otherwise push the next to the tick after (300 ms).
      const full =
        performance.now() >= this.#fullRetryAt &&
        (this.#fullAt === null ||
          at < this.#fullAt ||
          at - this.#fullAt + tickIntervalMs(this.#cfg) / 2 >= fullIntervalMs(this.#cfg));
      // Invariant: an entry is sent once. A call that failed may have run on Redis all the same
      // (a timeout says only that no reply came in time), so resending it would append it twice,
      // and each resend of a growing backlog would carry everything before it again. A block in
      // use is told again within SHARE_EVERY_MS (prefix-index.ts); one the failure lost is only
      // learnt later by the peers.
      const fresh = this.#opts.host.logEntry();
      const entry = fresh.length > MAX_ENTRY_CHARS ? '' : fresh;
      const call = bounded(
        (client as unknown as SyncCommand).slagateSync(
          ...this.#scriptKeys(),
          this.#opts.instanceId,
          full ? this.#opts.host.snapshot(at) : '',
          this.ttlMs,
          MAX_INSTANCES,
          entry,
          this.#logFrom,
          logMaxLen(this.#cfg),
          this.#logRead,
          LOG_TTL_MS,
          LOG_READ_BYTES,
          this.#opts.host.inflight(),
          this.#departedMs(),
        ),
        this.#cfg.command_timeout_ms,
        'sync',
      );
      let reply: unknown;
      try {
        reply = await call;
      } catch (e) {
        if (full) {
          this.#fullFailures++;
          this.#fullRetryAt =
            performance.now() +
            Math.min(fullIntervalMs(this.#cfg) * 2 ** Math.min(this.#fullFailures - 1, 16), this.ttlMs);
          this.#fullOwed = true;
        }
        // Redis answered with an error (a key of the wrong type, a command the ACL denies):
        // nothing is pending on the connection, and a new one would get the same answer. The next
        // tick tries again, at the usual pace. Except READONLY: the server is a replica now (a
        // failover behind a DNS name that has moved on), and only a new connection finds the
        // primary. Redis 7 starts the script's error with it; Redis 6 and earlier wrap it
        // ("ERR Error running script (call to f_…): @user_script:…: -READONLY You can't write…").
        if (e instanceof ReplyError && !READONLY.test((e as Error).message)) throw e;
        this.#logRead = Math.max(1, this.#logRead >> 1);
        // Whatever is still pending on this connection goes with it (see the invariants). The
        // client ends the socket, destroys it if it is not closed within a command timeout
        // (redis-client.ts), and reconnects.
        // Only the connection the call went out on: one that closed under it (its call is never
        // answered, and times out) may have been replaced meanwhile by a fresh one, which stays.
        if (this.#connections === connection) {
          this.#dropped = e instanceof Error ? e.message : String(e);
          client.disconnect(true);
        }
        throw e;
      }
      this.#logRead = Math.min(LOG_READ, this.#logRead * 2);
      const parsed = parseReply(reply, this.#opts.instanceId);
      const { peers, inflight, log, lastId, logError: replied } = parsed;
      if (peers !== null) {
        this.#fullAt = at;
        this.#inFull = parsed.fullIds.filter((id) => parsed.inflightIds.has(id));
      } else if (this.#inFull.some((id) => !parsed.inflightIds.has(id))) {
        // A peer in the view's full part stopped (it left, or its heartbeat expired): its counts are
        // gone already, and the next tick exchanges the full snapshots, so that its windows and fits
        // leave a tick after them, not up to half a refresh interval.
        this.#fullAt = null;
      }
      if (lastId !== null) this.#logFrom = lastId;
      // A tick with nothing to append only read the log: what it says of writes (refused under
      // maxmemory, say) is not news, so the last append's verdict stands.
      const logError = replied === null && entry === '' ? this.#logError : replied;
      if (logError !== this.#logError) {
        this.#logError = logError;
        if (logError !== null) {
          this.#opts.logger?.warn(
            { err: logError, key: this.keys.log },
            'shared prefix log unusable: sharing the other state without it',
          );
        }
      }
      if (this.#closed) return;
      // The log first: applyPeers tells the listeners, who then see both.
      if (log.length > 0) this.#opts.host.applyLog(log);
      this.#peers = this.#opts.host.applyPeers(peers, inflight, now());
      this.#lastOkAt = now();
      if (peers !== null) {
        this.#fullOwed = false;
        this.#fullFailures = 0;
        this.#fullRetryAt = 0;
      }
      // Only the in-flight part passed, the full exchange still failing: still degraded, its error kept.
      if (this.#fullOwed) return;
      // An error the client reported between ticks (a reset it recovered from) is over too.
      this.#lastError = null;
      if (this.#degraded) {
        this.#degraded = false;
        this.#opts.logger?.info({ peers: this.#peers }, 'state store reachable: sharing state');
      }
    } catch (e) {
      this.#lastError = e instanceof Error ? e.message : String(e);
      if (!this.#degraded) {
        this.#degraded = true;
        this.#opts.logger?.warn({ err: this.#lastError }, 'state store unreachable: serving on local state');
      }
    } finally {
      this.#lastDurationMs = performance.now() - started;
    }
  }

  #scriptKeys(): ScriptKeys {
    const k = this.keys;
    return [k.instances, k.snapshots, k.log, k.inflight, k.departed];
  }

  #departedMs(): number {
    return this.#opts.departedMs ?? DEPARTED_MS;
  }

  /**
   * Stops the timer, withdraws this instance, leaving its tenants' tokens behind (best effort,
   * bounded), and disconnects.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    await this.#busy;
    if (this.client.status === 'ready') {
      const leave = (this.client as unknown as SyncCommand).slagateLeave(
        ...this.#scriptKeys(),
        this.#opts.instanceId,
        this.#opts.host.departing(this.#opts.now()),
        this.#departedMs(),
        MAX_INSTANCES,
      );
      // The log stays: what this instance routed is still in the backends' caches.
      await bounded(leave, this.#cfg.command_timeout_ms, 'leave').catch(() => {});
    }
    this.client.disconnect();
    this.#resolveReady();
  }
}

/**
 * The script returns [[id, snapshot, ...], [[logId, [field, value, ...]], ...], error, [id, part,
 * ...], full, [departed, ...]]: the peers' full snapshots (none unless `full` is 1), the log entries
 * read (of which this instance's own are dropped), the error Redis gave the log's commands ('' when
 * none; the rest was exchanged all the same), the peers' in-flight parts, and the departed
 * instances' tenant tokens (none unless `full` is 1), which join the peers' snapshots.
 */
function parseReply(
  reply: unknown,
  self: string,
): {
  /** The peers' full snapshots and the departed instances' tenant tokens (null unless the tick was full). */
  peers: string[] | null;
  /** The peers whose full snapshots came (none unless the tick was full). */
  fullIds: string[];
  inflight: string[];
  /** The peers whose in-flight parts came. */
  inflightIds: Set<string>;
  log: string[];
  lastId: string | null;
  logError: string | null;
} {
  if (
    !Array.isArray(reply) ||
    !Array.isArray(reply[0]) ||
    !Array.isArray(reply[1]) ||
    !Array.isArray(reply[3])
  ) {
    throw new Error('unexpected reply from the sync script');
  }
  const logError = typeof reply[2] === 'string' && reply[2] !== '' ? reply[2] : null;
  const split = (pairs: unknown[]) => {
    const ids: string[] = [];
    const values: string[] = [];
    for (let i = 0; i + 1 < pairs.length; i += 2) {
      const id = pairs[i];
      const s = pairs[i + 1];
      if (typeof id !== 'string' || typeof s !== 'string') continue;
      ids.push(id);
      values.push(s);
    }
    return { ids, values };
  };
  const full = reply[4] === 1 ? split(reply[0] as unknown[]) : null;
  // Departed instances' tenant tokens, snapshots of their own (not peers: no id, nothing in flight).
  const departed = Array.isArray(reply[5])
    ? (reply[5] as unknown[]).filter((d) => typeof d === 'string')
    : [];
  const counts = split(reply[3] as unknown[]);
  const log: string[] = [];
  let lastId: string | null = null;
  for (const e of reply[1] as unknown[]) {
    if (!Array.isArray(e) || typeof e[0] !== 'string' || !Array.isArray(e[1])) continue;
    lastId = e[0];
    const fields = e[1] as unknown[];
    let who: unknown = null;
    let payload: unknown = null;
    for (let i = 0; i + 1 < fields.length; i += 2) {
      if (fields[i] === 'i') who = fields[i + 1];
      else if (fields[i] === 'p') payload = fields[i + 1];
    }
    if (who !== self && typeof payload === 'string') log.push(payload);
  }
  return {
    peers: full === null ? null : [...full.values, ...(departed as string[])],
    fullIds: full?.ids ?? [],
    inflight: counts.values,
    inflightIds: new Set(counts.ids),
    log,
    lastId,
    logError,
  };
}

/** Rejects after `ms` whatever `p` does; a late rejection of `p` is swallowed. */
function bounded<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`redis ${what} timed out after ${ms} ms`)), ms);
  });
  p.catch(() => {});
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
