export { Roost, Sessions, Session, Artifacts, ExecHandle } from "./roost.js";
export { Files, FileType } from "./files.js";
export type { FileInfo, UploadTreeResponse } from "./files.js";
export type { AttachOptions, CreateOptions, ExecOptions, ExecResult, ExecInfo, SessionRecord } from "./roost.js";
export type { ConnectOptions, Pem } from "./transport.js";
export { DEFAULT_SOCKET } from "./transport.js";
export * from "./errors.js";
