import { describe, expect, it } from 'vitest';
import { assertTransition, canTransition, TRANSITIONS } from '../../daemon/model/state.js';
import { SandboxState } from '../../daemon/api/schema.js';

describe('state machine', () => {
  it('covers every state', () => {
    expect(Object.keys(TRANSITIONS).sort()).toEqual([...SandboxState.options].sort());
  });
  it('destroyed is terminal and reachable from every other state', () => {
    expect(TRANSITIONS.destroyed).toEqual([]);
    for (const s of SandboxState.options) if (s !== 'destroyed') expect(canTransition(s, 'destroyed')).toBe(true);
  });
  it('refuses illegal transitions with FailedPrecondition', () => {
    expect(() => assertTransition('x', 'stopped', 'paused')).toThrow(expect.objectContaining({ kind: 'FailedPrecondition' }));
    expect(() => assertTransition('x', 'running', 'creating')).toThrow(/running; cannot make it creating/);
    expect(() => assertTransition('x', 'stopped', 'running')).not.toThrow();
  });
});
