/**
 * The contract between an agent connection (./client.ts) and what runs over its streams
 * (./exec.ts, ./files.ts): each exec or file operation owns one stream id, receives that
 * stream's frames through a {@link StreamSink}, and sends through the {@link StreamHost}.
 */
import { internal, unimplemented, type DsecError } from '../errors.js';
import type { Frame } from './protocol.js';

/** Per-stream receiver of frames (exec or file operation). */
export interface StreamSink {
  /** A frame on this stream; throwing drops the connection. */
  onFrame(f: Frame): void;
  /** The connection is gone. */
  fail(err: Error): void;
}

/** What a stream's owner can do on its connection. */
export interface StreamHost {
  /** True once the connection is closed (by the client or because it was lost). */
  isClosed(): boolean;
  /** A stream id no live stream uses. */
  alloc(): number;
  /** Routes the frames of `stream` to `sink` from now on. */
  open(stream: number, sink: StreamSink): void;
  /** Stops routing `stream` (its last frame came, or its owner gave it up). */
  forget(stream: number): void;
  /** Whether `stream` is still routed to `sink`. */
  owns(stream: number, sink: StreamSink): boolean;
  /** Sends one frame (dropped once the connection is closed). */
  send(type: number, stream: number, payload?: Buffer): void;
  /** The consumer of `stream` is behind: stop reading the socket (every stream) until it catches up. */
  pauseFor(stream: number): void;
  /** The consumer of `stream` caught up (or it ended): read again when no other holds the socket paused. */
  unpauseFor(stream: number): void;
  /** @throws DsecError Unimplemented when the agent's HELLO does not list `feature`; `what` names the operation. */
  requireFeature(feature: string, what: string): void;
  /** The Unavailable error of a lost (or closed) connection, naming why. */
  lostError(reason: string): DsecError;
  /** Resolves once the socket's write buffer is below its high-water mark, or the connection closed. */
  drained(): Promise<void>;
}

/** What an ERROR frame on a stream means for the caller. */
export function streamError(stream: number, payload: Buffer): DsecError {
  const msg = payload.toString('utf8');
  if (/unknown or unexpected frame type/.test(msg)) {
    return unimplemented(`the agent does not support this operation (stream ${stream}: ${msg})`);
  }
  return internal(`agent error on stream ${stream}: ${msg}`);
}

