package supervisor

// Leave makes s's Run return, once its context ends, with every cell left
// running: what a killed agent leaves for the next one to adopt.
func Leave(s *Supervisor) { s.leave.Store(true) }
