import { readFileSync } from "node:fs";
import type * as http2 from "node:http2";
import * as net from "node:net";
import type { Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

/** The socket roostd listens on by default (roostd --socket). */
export const DEFAULT_SOCKET = "/run/roost/roostd.sock";

/**
 * A PEM file's path, or its contents. A string is a path: certificates are files an
 * operator made (roostctl certs init), and a path in an error says which one is wrong.
 */
export type Pem = string | Uint8Array;

export interface ConnectOptions {
  /**
   * roostd's unix socket: $ROOST_SOCKET, else /run/roost/roostd.sock. Ignored when
   * `server` is set.
   */
  socket?: string;
  /**
   * roostd's remote listener (roostd --listen-tcp), "host:port" or "https://host:port",
   * reached over TLS with a client certificate: `ca`, `cert` and `key` are then required.
   */
  server?: string;
  /** The CA that signed roostd's certificate. */
  ca?: Pem;
  /** This client's certificate and key. */
  cert?: Pem;
  key?: Pem;
}

function pem(what: string, v: Pem | undefined): Buffer {
  if (v === undefined) {
    throw new TypeError(`Roost.connect: server is set, so ${what} is required (a PEM file's path or its contents)`);
  }
  if (typeof v !== "string") {
    return Buffer.from(v);
  }
  try {
    return readFileSync(v);
  } catch (err) {
    throw new TypeError(`Roost.connect: ${what}: ${(err as Error).message}`);
  }
}

/**
 * What this client lets roostd send ahead of what it has read: each stream's window (an
 * HTTP/2 setting) and the connection's, which bounds every stream's together. Node's are 64
 * KiB each, so a ReadFile's 256 KiB messages came a quarter at a time, each quarter after a
 * WINDOW_UPDATE: a 100 MiB read took 985 ms over mTLS and 819 over the socket with them, 653
 * and 524 with these (the two interleaved on one roostd; bench/sdk.sh has grpc-go's client,
 * whose windows grow, beside them). A caller that stops reading a stream leaves at most this
 * much of it buffered.
 */
const STREAM_WINDOW = 4 << 20;
const CONNECTION_WINDOW = 8 << 20;

/**
 * WindowedSessionManager widens each connection's receive window at its first stream: the
 * connection's window has no setting of its own, only a WINDOW_UPDATE the session sends.
 */
class WindowedSessionManager extends Http2SessionManager {
  private readonly widened = new WeakSet<http2.Http2Session>();

  override async request(...args: Parameters<Http2SessionManager["request"]>): Promise<http2.ClientHttp2Stream> {
    const stream = await super.request(...args);
    const session = stream.session;
    if (session && !session.destroyed && !this.widened.has(session)) {
      this.widened.add(session);
      session.setLocalWindowSize(CONNECTION_WINDOW);
    }
    return stream;
  }
}

const settings = { initialWindowSize: STREAM_WINDOW };

/**
 * transportFor is gRPC (always HTTP/2) to roostd: Exec is a bidirectional stream, which neither
 * gRPC-Web nor Connect over HTTP/1.1 can carry.
 */
export function transportFor(opts: ConnectOptions): { transport: Transport; close: () => void; local: boolean; target: string } {
  if (opts.server) {
    const baseUrl = /^https:\/\//.test(opts.server) ? opts.server : `https://${opts.server}`;
    if (/^[a-z]+:\/\//.test(opts.server) && !opts.server.startsWith("https://")) {
      throw new TypeError(`Roost.connect: server ${JSON.stringify(opts.server)}: only https:// (mTLS) is served remotely`);
    }
    const manager = new WindowedSessionManager(baseUrl, {}, { settings, ca: pem("ca", opts.ca), cert: pem("cert", opts.cert), key: pem("key", opts.key) });
    const transport = createGrpcTransport({ baseUrl, sessionManager: manager });
    return { transport, close: () => manager.abort(), local: false, target: baseUrl };
  }
  const socket = opts.socket || process.env.ROOST_SOCKET || DEFAULT_SOCKET;
  // The authority is the socket's: any host name serves, since no DNS is asked.
  const baseUrl = "http://localhost";
  const manager = new WindowedSessionManager(baseUrl, {}, { settings, createConnection: () => net.connect(socket) });
  const transport = createGrpcTransport({ baseUrl, sessionManager: manager });
  return { transport, close: () => manager.abort(), local: true, target: socket };
}
