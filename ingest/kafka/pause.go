package kafka

import "time"

// An operator pauses a source (tidemark pause) to stop its loading
// without stopping the process or the other sources: its topics are no
// longer fetched, while the ingester stays a member of the group with its
// partitions assigned, so that nothing rebalances, and their stored
// offsets stay where the last write put them. Records fetched before the
// pause are written as usual; the records of a paused topic that the
// client buffered are dropped by the client and fetched again after the
// resume, from the position the ingester consumed to.

// pollPauseCheck bounds a poll's wait while Options.Paused is set, so
// that a pause or a resume is obeyed within about this long even when
// no record arrives (a poll that fetches nothing would wait for ever).
const pollPauseCheck = time.Second

// obeyPauses pauses the fetching of the topics of the sources an operator
// paused, and resumes it for those resumed. Run's loop calls it before
// each poll.
func (in *Ingester) obeyPauses() {
	if in.isPaused == nil {
		return
	}
	for _, src := range in.sources {
		paused := in.isPaused(src.name)
		if paused == src.paused {
			continue
		}
		src.paused = paused
		if paused {
			in.cl.PauseFetchTopics(src.topics...)
			in.log.Info("source paused: its topics are not fetched; the partitions stay assigned", "source", src.name, "topics", src.topics)
		} else {
			in.cl.ResumeFetchTopics(src.topics...)
			in.log.Info("source resumed: its topics are fetched again", "source", src.name, "topics", src.topics)
		}
		for _, t := range src.topics {
			in.m.topicPaused.WithLabelValues(src.name, t).Set(boolGauge(paused))
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
