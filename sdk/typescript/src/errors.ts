import { Code, ConnectError } from "@connectrpc/connect";

/**
 * RoostError is every error a call to roostd ends in: `code` is the gRPC status code
 * roostd answered with, `message` roostd's own words (which name the field, flag or
 * session at fault). A subclass stands for each code a caller may act on.
 */
export class RoostError extends Error {
  readonly code: Code;
  constructor(message: string, code: Code, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** No such session, capsule or file. */
export class NotFoundError extends RoostError {}
/** The request is wrong: a bad capsule, name, path or argument. */
export class InvalidArgumentError extends RoostError {}
/** A name@version or session name already taken. */
export class AlreadyExistsError extends RoostError {}
/** Refused: the caller may not do this (a session's containment, a client certificate). */
export class PermissionDeniedError extends RoostError {}
/** A remote caller without a certificate roostd's client CA signed. */
export class UnauthenticatedError extends RoostError {}
/** A limit was reached: the machine's token budget, a session's share, a size. */
export class ResourceExhaustedError extends RoostError {}
/** The session is not in a state that allows it (not running, still live, ...). */
export class FailedPreconditionError extends RoostError {}
/** roostd cannot be reached, or went away during the call. */
export class UnavailableError extends RoostError {}
/** The call's own timeout (exec's `timeout`) ran out. */
export class DeadlineExceededError extends RoostError {}

const byCode = new Map<Code, new (message: string, code: Code, options?: { cause?: unknown }) => RoostError>([
  [Code.NotFound, NotFoundError],
  [Code.InvalidArgument, InvalidArgumentError],
  [Code.AlreadyExists, AlreadyExistsError],
  [Code.PermissionDenied, PermissionDeniedError],
  [Code.Unauthenticated, UnauthenticatedError],
  [Code.ResourceExhausted, ResourceExhaustedError],
  [Code.FailedPrecondition, FailedPreconditionError],
  [Code.Unavailable, UnavailableError],
  [Code.DeadlineExceeded, DeadlineExceededError],
]);

const unreachable = new Set(["ENOENT", "ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "ENOTSOCK"]);

/** fromConnect turns whatever a call threw into the RoostError for its code. */
export function fromConnect(err: unknown): RoostError {
  if (err instanceof RoostError) {
    return err;
  }
  const ce = ConnectError.from(err);
  let code = ce.code;
  // A socket that is not there or refuses, or a TLS handshake either side refused, comes as
  // the system's error, not a status roostd sent; roostctl too takes a refused handshake
  // as a daemon it cannot reach.
  const sys = ce.isWireError ? undefined : errno(err);
  if (sys !== undefined && (unreachable.has(sys) || sys.startsWith("ERR_SSL_") || sys.startsWith("ERR_TLS_"))) {
    code = Code.Unavailable;
  } else if (sys === "EACCES") {
    code = Code.PermissionDenied;
  }
  const cls = byCode.get(code) ?? RoostError;
  return new cls(ce.rawMessage, code, { cause: err });
}

function errno(err: unknown): string | undefined {
  for (let e = err; e instanceof Error; e = e.cause) {
    const c = (e as NodeJS.ErrnoException).code;
    if (typeof c === "string" && ((e as NodeJS.ErrnoException).syscall !== undefined || /^ERR_(SSL|TLS)_/.test(c))) {
      return c;
    }
  }
  return undefined;
}

/** wrap runs a call and rethrows its failure as a RoostError. */
export async function wrap<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (err) {
    throw fromConnect(err);
  }
}
