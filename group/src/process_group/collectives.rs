//! The collectives of the group: every call a star through process 0, its frames checked
//! against the collective every process must be in (sequence, operation, root, label), each
//! bounded by its timeout; a failure anywhere ends it for every process.

use super::*;

impl ProcessGroup {
    pub fn barrier(&mut self, label: &str, timeout: Duration) -> Result<(), GroupError> {
        self.collective(Op::Barrier, 0, label, &[], timeout).map(|_| ())
    }

    /// Every process's bytes, by rank, on every process.
    pub fn all_gather(
        &mut self,
        label: &str,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, GroupError> {
        let out = self.collective(Op::AllGather, 0, label, bytes, timeout)?;
        self.decode(label, &out.expect("all_gather returns everywhere"))
    }

    /// `root`'s bytes on every process (`bytes` is ignored elsewhere, as in MPI_Bcast).
    pub fn broadcast(
        &mut self,
        label: &str,
        root: usize,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, GroupError> {
        Ok(self.collective(Op::Broadcast, root, label, bytes, timeout)?.expect("broadcast returns"))
    }

    /// Every process's bytes, by rank, at `root`; `None` elsewhere.
    pub fn gather_to(
        &mut self,
        label: &str,
        root: usize,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<Vec<u8>>>, GroupError> {
        match self.collective(Op::Gather, root, label, bytes, timeout)? {
            Some(list) => self.decode(label, &list).map(Some),
            None => Ok(None),
        }
    }

    pub fn all_gather_json<T: Serialize + DeserializeOwned>(
        &mut self,
        label: &str,
        value: &T,
        timeout: Duration,
    ) -> Result<Vec<T>, GroupError> {
        let bytes = to_json(label, value)?;
        let all = self.all_gather(label, &bytes, timeout)?;
        self.decode_json_all(label, &all)
    }

    /// `root`'s value on every process; other processes pass `None`.
    pub fn broadcast_json<T: Serialize + DeserializeOwned>(
        &mut self,
        label: &str,
        root: usize,
        value: Option<&T>,
        timeout: Duration,
    ) -> Result<T, GroupError> {
        let bytes = match value {
            Some(v) => to_json(label, v)?,
            None if self.rank() == root => {
                return Err(GroupError::Usage(format!(
                    "`{label}`: process {root} is the broadcast's root but passed no value"
                )));
            }
            None => Vec::new(),
        };
        let out = self.broadcast(label, root, &bytes, timeout)?;
        serde_json::from_slice(&out).map_err(|e| self.bad_json(label, root, &e))
    }

    pub fn gather_json<T: Serialize + DeserializeOwned>(
        &mut self,
        label: &str,
        root: usize,
        value: &T,
        timeout: Duration,
    ) -> Result<Option<Vec<T>>, GroupError> {
        let bytes = to_json(label, value)?;
        match self.gather_to(label, root, &bytes, timeout)? {
            Some(all) => self.decode_json_all(label, &all).map(Some),
            None => Ok(None),
        }
    }

    fn decode_json_all<T: DeserializeOwned>(
        &self,
        label: &str,
        all: &[Vec<u8>],
    ) -> Result<Vec<T>, GroupError> {
        all.iter()
            .enumerate()
            .map(|(rank, b)| serde_json::from_slice(b).map_err(|e| self.bad_json(label, rank, &e)))
            .collect()
    }

    fn bad_json(&self, label: &str, rank: usize, e: &serde_json::Error) -> GroupError {
        GroupError::Usage(format!(
            "`{label}`: the value from {} does not decode: {e}",
            self.members[rank]
        ))
    }

    fn decode(&self, label: &str, list: &[u8]) -> Result<Vec<Vec<u8>>, GroupError> {
        let items = decode_list(list).map_err(|e| {
            self.fail_here(Failure {
                peer: self.members[0].clone(),
                what: format!("sent a malformed result: {e}"),
                when: format!("during `{label}`"),
            })
        })?;
        if items.len() != self.count() {
            return Err(self.fail_here(Failure {
                peer: self.members[0].clone(),
                what: format!("sent {} values for {} processes", items.len(), self.count()),
                when: format!("during `{label}`"),
            }));
        }
        Ok(items)
    }

    fn set_phase(&self, phase: String) {
        *lock(&self.shared.phase) = phase;
    }

    /// One collective through process 0. Returns the result where the collective has one.
    pub(super) fn collective(
        &mut self,
        op: Op,
        root: usize,
        label: &str,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, GroupError> {
        let count = self.count();
        if root >= count {
            return Err(GroupError::Usage(format!(
                "`{label}`: root {root} is outside the group of {count} processes"
            )));
        }
        if self.finished {
            return Err(GroupError::Usage(format!("`{label}`: the group has finished")));
        }
        self.check_failed()?;
        self.set_phase(format!("during `{label}`"));
        let deadline = now() + timeout;
        let seq = self.seq;
        self.seq += 1;
        let me = self.rank();
        let data = |payload: Vec<u8>| {
            Msg::Data(Data { seq, op, root: root as u32, label: label.into(), payload })
        };
        let result = if count == 1 {
            match op {
                Op::Barrier => None,
                Op::AllGather | Op::Gather => Some(encode_list(&[bytes.to_vec()])),
                Op::Broadcast => Some(bytes.to_vec()),
            }
        } else if me == 0 {
            let expect = Expect { seq, op, root, label, timeout, deadline };
            match op {
                Op::Barrier | Op::AllGather | Op::Gather => {
                    let leaves: Vec<usize> = (1..count).collect();
                    let mut all = vec![bytes.to_vec()];
                    all.extend(self.wait_all(&leaves, &expect)?);
                    let list = encode_list(&all);
                    match op {
                        Op::Barrier => {
                            self.send_all(&data(Vec::new()), &leaves, label)?;
                            None
                        }
                        Op::AllGather => {
                            self.send_all(&data(list.clone()), &leaves, label)?;
                            Some(list)
                        }
                        _ if root == 0 => Some(list),
                        _ => {
                            self.send_all(&data(list), &[root], label)?;
                            None
                        }
                    }
                }
                Op::Broadcast => {
                    let payload = if root == 0 {
                        bytes.to_vec()
                    } else {
                        self.wait_all(&[root], &expect)?.remove(0)
                    };
                    let leaves: Vec<usize> = (1..count).collect();
                    self.send_all(&data(payload.clone()), &leaves, label)?;
                    Some(payload)
                }
            }
        } else {
            let expect = Expect { seq, op, root, label, timeout, deadline };
            let sends = match op {
                Op::Barrier | Op::AllGather | Op::Gather => true,
                Op::Broadcast => root == me,
            };
            if sends {
                self.send_all(&data(bytes.to_vec()), &[0], label)?;
            }
            let waits = match op {
                Op::Barrier | Op::AllGather | Op::Broadcast => true,
                Op::Gather => root == me,
            };
            if waits { Some(self.wait_all(&[0], &expect)?.remove(0)) } else { None }
        };
        self.set_phase(format!("after `{label}`"));
        Ok(result)
    }

    fn send_all(&self, msg: &Msg, ranks: &[usize], label: &str) -> Result<(), GroupError> {
        for &rank in ranks {
            let conn = self.shared.conns[rank].as_ref().expect("a connection to every peer");
            if let Err(e) = conn.send(msg) {
                return Err(self.fail_here(Failure {
                    peer: conn.peer.clone(),
                    what: if e.kind() == ErrorKind::InvalidData {
                        format!("could not be sent `{label}`: {e}")
                    } else {
                        format!("could not be written to ({e})")
                    },
                    when: format!("during `{label}`"),
                }));
            }
        }
        Ok(())
    }

    /// Each rank's next frame, checked to belong to this collective.
    fn wait_all(
        &mut self,
        ranks: &[usize],
        expect: &Expect<'_>,
    ) -> Result<Vec<Vec<u8>>, GroupError> {
        let mut out: Vec<Option<Vec<u8>>> = vec![None; ranks.len()];
        let mut deadline = expect.deadline;
        let mut extended = false;
        loop {
            // Frames already here complete the collective even when a failure came in just
            // after them: the collective did complete everywhere.
            while let Ok(event) = self.events.as_ref().expect("events").try_recv() {
                self.absorb(event);
            }
            for (i, &rank) in ranks.iter().enumerate() {
                if out[i].is_none()
                    && let Some(data) = self.pending[rank].pop_front()
                {
                    self.check_frame(rank, &data, expect)?;
                    out[i] = Some(data.payload);
                }
            }
            if out.iter().all(Option::is_some) {
                return Ok(out.into_iter().map(|o| o.expect("all present")).collect());
            }
            self.check_failed()?;
            let left = deadline.saturating_duration_since(now());
            match self.events.as_ref().expect("events").recv_timeout(left) {
                Ok(event) => self.absorb(event),
                Err(RecvTimeoutError::Timeout) if !extended && self.rank() != 0 => {
                    // Process 0 has the same timeout and knows who is late: give its verdict
                    // a moment to arrive rather than blaming process 0 itself.
                    extended = true;
                    deadline = now() + expect.timeout.min(LEAF_VERDICT_MARGIN);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let late: Vec<usize> = ranks
                        .iter()
                        .zip(&out)
                        .filter(|(_, o)| o.is_none())
                        .map(|(&r, _)| r)
                        .collect();
                    return Err(self.late(&late, expect));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    unreachable!("the group holds a sender")
                }
            }
        }
    }

    fn absorb(&mut self, event: Event) {
        match event {
            Event::Data { from, data } => self.pending[from].push_back(data),
            Event::Bye { from } => self.byes[from] = true,
            Event::Failed => {}
        }
    }

    fn late(&self, late: &[usize], expect: &Expect<'_>) -> GroupError {
        let ms = expect.timeout.as_millis();
        let what = if self.rank() == 0 {
            let others = if late.len() > 1 {
                let list: Vec<String> = late.iter().map(usize::to_string).collect();
                format!(" (late: processes {})", list.join(", "))
            } else {
                String::new()
            };
            format!("did not reach `{}` within {ms} ms{others}", expect.label)
        } else {
            format!(
                "did not complete `{}` within {ms} ms for {} (it waits for every process)",
                expect.label, self.shared.me
            )
        };
        self.fail_here(Failure {
            peer: self.members[late[0]].clone(),
            what,
            when: format!("during `{}`", expect.label),
        })
    }

    fn check_frame(&self, from: usize, data: &Data, expect: &Expect<'_>) -> Result<(), GroupError> {
        let same = data.seq == expect.seq
            && data.op == expect.op
            && data.root as usize == expect.root
            && data.label == expect.label;
        if same {
            return Ok(());
        }
        Err(self.fail_here(Failure {
            peer: self.members[from].clone(),
            what: format!(
                "is in {} `{}` (collective #{}, root {}) while {} is in {} `{}` (collective #{}, \
                 root {}): every process must make the same collective calls in the same order",
                data.op.name(),
                data.label,
                data.seq,
                data.root,
                self.shared.me,
                expect.op.name(),
                expect.label,
                expect.seq,
                expect.root
            ),
            when: format!("during `{}`", expect.label),
        }))
    }
}

struct Expect<'a> {
    seq: u64,
    op: Op,
    root: usize,
    label: &'a str,
    timeout: Duration,
    deadline: Instant,
}

fn to_json<T: Serialize>(label: &str, value: &T) -> Result<Vec<u8>, GroupError> {
    serde_json::to_vec(value)
        .map_err(|e| GroupError::Usage(format!("`{label}`: the value does not encode: {e}")))
}
