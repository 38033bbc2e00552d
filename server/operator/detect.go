package operator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"breakwater/detect"
)

// Detection runs the daily detection on demand and lists its findings:
// detect.Runner.
type Detection interface {
	Run(ctx context.Context, day string, mail bool) (detect.Report, error)
	Yesterday(now time.Time) string
	Recent(from, to string) ([]detect.Finding, error)
}

var _ Detection = (*detect.Runner)(nil)

// ErrBadDay means a day is not written YYYY-MM-DD.
var ErrBadDay = errors.New("server: day must be YYYY-MM-DD")

// errNoDetection means the operator has no detection to run.
var errNoDetection = errors.New("operator: detection is not set up")

// SetDetection gives the operator the detection it runs on demand and
// shows on the dashboard.
func (o *Operator) SetDetection(d Detection) { o.detection = d }

// DetectRun runs the daily detection for day ("" means yesterday in the
// budget's time zone) and returns its findings; mail sends the digest.
func (o *Operator) DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error) {
	if o.detection == nil {
		return detect.Report{}, errNoDetection
	}
	if day == "" {
		day = o.detection.Yesterday(o.now())
	}
	if t, err := time.Parse("2006-01-02", day); err != nil || t.Format("2006-01-02") != day {
		return detect.Report{}, fmt.Errorf("%w: got %q", ErrBadDay, day)
	}
	return o.detection.Run(ctx, day, mail)
}

// DetectRun asks the running server to run the daily detection.
func (a *AdminClient) DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error) {
	var out detect.Report
	err := a.call(ctx, http.MethodPost, "/api/detect/run", DetectRunRequest{Day: day, NoMail: !mail}, &out)
	return out, err
}

// RecentFindings lists the findings of the days from from on; none without
// a detection.
func (o *Operator) RecentFindings(from string) ([]detect.Finding, error) {
	if o.detection == nil {
		return nil, nil
	}
	return o.detection.Recent(from, "")
}
