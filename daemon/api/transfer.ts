/**
 * How much of one file transfer dsecd holds in its own buffers, and the bound it keeps.
 *
 * A single-file transfer (GET/PUT /v1/sandboxes/{id}/files) streams between an HTTP
 * connection and the sandbox's agent connection with backpressure on every hop, so
 * dsecd holds a fixed window of it however large the file and however slow either end
 * is. Where each term comes from:
 *
 * Upload (PUT): the HTTP request stream holds at most its high-water mark
 * ({@link NODE_STREAM_HWM}) plus one socket read ({@link SOCKET_READ_BYTES}: the HTTP
 * parser pushes all of one read before the paused socket stops reading); the pass-through
 * in front of the agent client at most its two sides' marks plus one chunk each, and the
 * agent client one more chunk it is cutting into frames; the agent connection's send queue at most the write window (WRITE_WINDOW_BYTES, 4 MiB: the
 * client stops taking body bytes while that much is unacknowledged by the agent) plus one
 * frame (FILE_FRAME_BYTES and its header). Sum: {@link UPLOAD_BUFFER_BOUND_BYTES}.
 *
 * Download (GET): the agent connection's frame being received at most the largest
 * frame (MAX_PAYLOAD, 1 MiB, and its header); the read stream at most its mark
 * (READ_STREAM_HWM, 256 KiB: above it the client pauses the socket, the agent's send
 * queue fills and it stops reading the file) plus what one socket read completes (one
 * read and the agent's file frame that was pending, {@link AGENT_FILE_CHUNK_BYTES}); the
 * HTTP response at most its mark plus one chunk (an agent file frame). Sum:
 * {@link DOWNLOAD_BUFFER_BOUND_BYTES}.
 *
 * The routes measure what they hold ({@link TransferMeter}) each time one of those
 * buffers may have grown (a body chunk taken, a frame sent or acknowledged, a chunk
 * pushed or written), so `dsec_file_transfer_buffered_bytes_peak` is the real peak,
 * which the bound caps. Bytes of a transfer that have left the process (kernel socket
 * buffers, the agent) are not dsecd's and not counted; neither is garbage the JavaScript
 * heap has not collected yet (RSS shows that too, which is why RSS is no measure of this).
 */
import { FILE_FRAME_BYTES, READ_STREAM_HWM, WRITE_WINDOW_BYTES } from '../agent/client.js';
import { HEADER_LENGTH, MAX_PAYLOAD } from '../agent/protocol.js';

/** Node's default highWaterMark of a byte stream (stream.getDefaultHighWaterMark(false)): HTTP requests, responses, pass-throughs. */
export const NODE_STREAM_HWM = 16 * 1024;
/** The most one read of a socket delivers: Node reads stream sockets into 64 KiB buffers. */
export const SOCKET_READ_BYTES = 64 * 1024;
/** The largest FILE_DATA payload the agent sends (FILE_CHUNK in native/agent/files.c). */
export const AGENT_FILE_CHUNK_BYTES = 256 * 1024;

/** Most bytes of one upload dsecd holds at once (see the file comment): 4,656 KiB + 12 bytes (4.55 MiB). */
export const UPLOAD_BUFFER_BOUND_BYTES =
  (NODE_STREAM_HWM + SOCKET_READ_BYTES) + 2 * (NODE_STREAM_HWM + SOCKET_READ_BYTES) + SOCKET_READ_BYTES + WRITE_WINDOW_BYTES + FILE_FRAME_BYTES + HEADER_LENGTH;

/** Most bytes of one download dsecd holds at once (see the file comment): 1,872 KiB + 24 bytes (1.83 MiB). */
export const DOWNLOAD_BUFFER_BOUND_BYTES =
  (MAX_PAYLOAD + HEADER_LENGTH) + (READ_STREAM_HWM + SOCKET_READ_BYTES + AGENT_FILE_CHUNK_BYTES + HEADER_LENGTH) + (NODE_STREAM_HWM + AGENT_FILE_CHUNK_BYTES);

/** Most bytes of one single-file transfer, either way, dsecd holds at once. */
export const TRANSFER_BUFFER_BOUND_BYTES = Math.max(UPLOAD_BUFFER_BOUND_BYTES, DOWNLOAD_BUFFER_BOUND_BYTES);

/** One transfer being accounted: see {@link TransferMeter.track}. */
export interface TrackedTransfer {
  /** Measures what the transfer holds now; call whenever one of its buffers may have grown. */
  sample(): void;
  /** The transfer is over: it holds nothing any more. Safe to call twice. */
  end(): void;
}

/** The bytes file transfers hold in dsecd: now, and the most one has held at once. */
export class TransferMeter {
  private readonly held = new Map<number, number>();
  private next = 1;
  private peak = 0;

  /** Bytes the transfers in progress hold, as last measured, summed. */
  get bufferedBytes(): number {
    let n = 0;
    for (const v of this.held.values()) n += v;
    return n;
  }

  /** The most one transfer has held at once since this dsecd started, bytes. */
  get peakBytes(): number {
    return this.peak;
  }

  /**
   * Starts accounting one transfer; `probe` returns the bytes it holds now (the sum of
   * the lengths of the buffers on its path).
   */
  track(probe: () => number): TrackedTransfer {
    const id = this.next++;
    this.held.set(id, 0);
    return {
      sample: () => {
        if (!this.held.has(id)) return;
        const n = probe();
        this.held.set(id, n);
        if (n > this.peak) this.peak = n;
      },
      end: () => {
        this.held.delete(id);
      },
    };
  }
}
