/**
 * Trajectories (docs/TRAJECTORIES.md): the recorded steps of exec calls made with
 * `trajectory` and `step`; list, inspect, export (NDJSON, streamed) and remove them.
 */
import type http from 'node:http';
import { DsecApiError, errMessage } from './errors.js';
import { clip, ndjsonLines } from './ndjson.js';
import type { TrajectoryDetail, TrajectoryRecord, TrajectoryRemoved, TrajectorySummary } from './types.js';
import { trajectoryPath } from './paths.js';
import type { TransportClass } from './transport.js';

/** Options of {@link DsecClient.exportTrajectory}. */
export interface ExportTrajectoryOptions {
  /** Ends the stream: iteration then finishes normally, without an error (check the signal to tell a cut export from a whole one). */
  signal?: AbortSignal;
}

/** Mixes the trajectory calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withTrajectoryCalls<B extends TransportClass>(Base: B) {
  return class TrajectoryCalls extends Base {
    /** GET /v1/trajectories: the summary of every trajectory this dsecd holds, most recently updated first, as an array. */
    async listTrajectories(): Promise<TrajectorySummary[]> {
      return (await this.request<{ trajectories: TrajectorySummary[] }>('GET', '/v1/trajectories')).trajectories;
    }

    /** GET /v1/trajectories/{id}: the summary and every step (without output), in step order. Errors: `NotFound`. */
    getTrajectory(id: string): Promise<TrajectoryDetail> {
      return this.request<TrajectoryDetail>('GET', trajectoryPath(id));
    }

    /**
     * GET /v1/trajectories/{id}/export: every step with its request and recorded output,
     * in step order, as an async iterable of {@link TrajectoryRecord} (NDJSON on the wire,
     * streamed: a long trajectory is never held whole here). It ends after the last step;
     * `signal` or a `break` closes the connection (iteration then ends normally).
     * Errors: `NotFound` when opening; a malformed line is `Internal`; a dropped connection
     * is `Unavailable`.
     */
    async *exportTrajectory(id: string, opts: ExportTrajectoryOptions = {}): AsyncGenerator<TrajectoryRecord, void, undefined> {
      const signal = opts.signal;
      if (signal?.aborted) return;
      let res: http.IncomingMessage;
      try {
        res = await this.openStream('GET', trajectoryPath(id) + '/export', signal);
      } catch (e) {
        if (signal?.aborted) return;
        throw e;
      }
      try {
        for await (const line of ndjsonLines(res)) yield parseRecordLine(line, id);
      } catch (e) {
        if (signal?.aborted) return;
        if (e instanceof DsecApiError) throw e;
        throw new DsecApiError('Unavailable', `export of trajectory ${id} from ${this.where} broke: ${errMessage(e)}`, 0, { cause: e });
      } finally {
        res.destroy();
      }
    }

    /**
     * DELETE /v1/trajectories/{id}: discards the trajectory's recorded steps and resolves
     * with how many. The id stays reserved: an exec re-using it is refused
     * (`FailedPrecondition`, reason `trajectory_removed`) rather than run steps again.
     * Errors: `NotFound` (unknown or already removed), `Conflict` with reason
     * `in_progress` (a step of it is running now).
     */
    deleteTrajectory(id: string): Promise<TrajectoryRemoved> {
      return this.request<TrajectoryRemoved>('DELETE', trajectoryPath(id));
    }
  };
}

/** Parses one NDJSON line of a trajectory export; a malformed line is `Internal`. */
function parseRecordLine(line: string, id: string): TrajectoryRecord {
  try {
    return JSON.parse(line) as TrajectoryRecord;
  } catch (e) {
    throw new DsecApiError('Internal', `dsecd sent a malformed line in the export of trajectory ${id}: ${JSON.stringify(clip(line))}`, 200, { cause: e });
  }
}
